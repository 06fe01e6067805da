"""`ultra3 data prep sft` beside Megatron-Bridge's own packed-SFT preparation (`prepare_gpt_sft_packed_data`, what
its `scripts/training/prepare_gpt_sft_packed_data.py` runs), on the same conversations, tokenizer, chat template
and machine, in one run.

    python benchmarks/sft_prep_vs_bridge.py --bridge-python PY [--conversations 10000] [--pack-size 4096]
                                            [--runs 3] [--bridge-workers CPUS] [--vocab 32000]
                                            [--dir /tmp/u3bench-sft-vs-bridge]

`--bridge-python` is a Python with megatron-bridge 0.6.x and its Megatron-Core, torch (`torch==2.13.0`),
transformers, datasets and pyarrow, e.g. a scratch venv:

    python -m venv /tmp/mb && /tmp/mb/bin/pip install torch==2.13.0 && /tmp/mb/bin/pip install --no-deps \\
        megatron-bridge==0.6.2 'megatron-core>=0.19,<0.20' && /tmp/mb/bin/pip install 'transformers>=5.8,<=5.12.1' \\
        datasets pyarrow omegaconf einops tqdm absl-py

(add `--ignore-requires-python` to the second install on Python < 3.12; a pass-through `typing.override`, which
it imports, is then put first on its PYTHONPATH). Megatron-Bridge's package `__init__` imports every model bridge,
which needs Transformer Engine (GPU only): the runner loads its data modules without it.

The data: --conversations of recipes.samples.make_tiny_sft's generated chats (single and multi-turn, reasoning,
tool calls, long-tailed lengths; seeded), one JSONL file of `{"messages", "tools"}`. The tokenizer: a byte-level
BPE of --vocab tokens trained on their text, plus the chat markup as special tokens, its tokenizer_config.json
naming `<|im_end|>` as EOS and holding our nemotron3 template as `chat_template`, so both tools render the same
text through the same template and the same tokenizer. Alternating, --runs times each:

- Megatron-Bridge: `prepare_gpt_sft_packed_data(..., dataset_kwargs={chat: true,
  use_hf_tokenizer_chat_template: true}, num_tokenizer_workers=--bridge-workers)` into packed Parquet, one
  split. --bridge-workers defaults to the CPUs, its fastest here (PackedSequenceSpecs' own default, -1,
  tokenizes serially: 64 s against 38 s for 5,000 conversations on the 2-core VM);
- ours: `ultra3 data prep sft -c tiny datasets=[...] tokenizer=DIR pack_size=N valid_ratio=0 test_ratio=0
  --force` on the embedded default (this machine), the whole command.

Each is timed as a whole process with the peak RSS of its process tree. Then both outputs are read back
(pyarrow) and their totals compared: the same sequences and tokens mean both rendered and tokenized every
conversation alike. Loss tokens differ by one per assistant turn, which is checked: Megatron-Bridge also
trains on the newline after each `<|im_end|>`, our template marks the turn up to `<|im_end|>`. Packs differ
by algorithm (theirs first-fit shuffle, ours best-fit decreasing).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import data_prep_vs_megatron as vs  # noqa: E402  (timing, RSS, the shim)

MARKUP = ["<|im_start|>", "<|im_end|>"]
RUNNER = '''"""Megatron-Bridge's packed-SFT preparation, as its prepare_gpt_sft_packed_data.py script runs it."""
import os, sys, time, types
from pathlib import Path

import megatron  # megatron.bridge's __init__ imports every model bridge (Transformer Engine): skip it
root = next(p for p in (os.path.join(d, "bridge") for d in megatron.__path__) if os.path.isdir(p))
for name in ("megatron.bridge", "megatron.bridge.data", "megatron.bridge.data.builders"):
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(root, *name.split(".")[2:])]
    sys.modules[name] = module
from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
from megatron.bridge.data.packing.offline import prepare_gpt_sft_packed_data
from megatron.bridge.training.tokenizers.config import TokenizerConfig
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

data, tokenizer_dir, out, pack = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
started = time.time()
tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=tokenizer_dir))
out.mkdir(parents=True, exist_ok=True)
prepare_gpt_sft_packed_data(
    input_path=Path(data), output_path=out / f"training_{pack}.idx.parquet",
    output_metadata_path=out / "metadata.jsonl",
    packed_sequence_size=pack, tokenizer=tokenizer, max_seq_length=pack, seed=1234,
    packing_algorithm="first_fit_shuffle", dataset_kwargs={"chat": True, "use_hf_tokenizer_chat_template": True},
    pad_seq_to_mult=1, num_tokenizer_workers=int(sys.argv[5]), dataset_builder=build_gpt_sft_split)
print(f"Elapsed time: {time.time() - started:.2f} seconds")
'''


def corpus(work: Path, n: int) -> Path:
    from recipes.samples.make_tiny_sft import conversations

    path = work / f"chat-{n}.jsonl"
    if not path.exists():
        with open(f"{path}.tmp", "w") as f:
            for c in itertools.islice(conversations(7), n):
                f.write(json.dumps({"messages": c["messages"], **({"tools": c["tools"]} if c.get("tools") else {})})
                        + "\n")
        os.replace(f"{path}.tmp", path)
    return path


def tokenizer(work: Path, data: Path, vocab: int) -> str:
    """The trained BPE with the chat markup as special tokens, and a tokenizer_config.json for both tools."""
    from tokenizers import Tokenizer

    directory = work / f"chat-tokenizer-{vocab}"
    if not (directory / "tokenizer_config.json").exists():
        texts = work / "chat-texts.jsonl"
        with open(data) as f, open(texts, "w") as out:
            for line in f:
                for m in json.loads(line)["messages"]:
                    out.write(json.dumps({"text": m.get("content") or ""}) + "\n")
        tok = Tokenizer.from_file(str(Path(vs.bench.trained_tokenizer(work, [texts], vocab, 16), "tokenizer.json")))
        tok.add_special_tokens(MARKUP)
        directory.mkdir(parents=True, exist_ok=True)
        tok.save(str(directory / "tokenizer.json"))
        template = (REPO / "recipes" / "dataprep" / "templates" / "nemotron3.jinja").read_text()
        (directory / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
            "chat_template": template}))
    return str(directory)


def totals(files: list[Path]) -> dict:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = {"packs": 0, "sequences": 0, "tokens": 0, "loss_tokens": 0}
    for path in files:
        table = pq.read_table(path, columns=["input_ids", "loss_mask", "seq_start_id"])
        t["packs"] += table.num_rows
        t["sequences"] += int(pc.sum(pc.list_value_length(table["seq_start_id"])).as_py())
        t["tokens"] += int(pc.sum(pc.list_value_length(table["input_ids"])).as_py())
        t["loss_tokens"] += int(pc.sum(pc.list_flatten(table["loss_mask"])).as_py())
    return t


def bridge(args, work: Path, data: Path, tok: str) -> dict:
    runner = work / "bridge_pack.py"
    runner.write_text(RUNNER)
    out = work / "bridge-out"
    env = {**os.environ, "PYTHONPATH": str(work / "shim"), "TOKENIZERS_PARALLELISM": "false"}
    r = vs.timed([args.bridge_python, str(runner), str(data), tok, str(out), str(args.pack_size),
                  str(args.bridge_workers)], env, work)
    r["inner"] = float(r["log"].rsplit("Elapsed time: ", 1)[1].split()[0])
    r["totals"] = totals(sorted(out.glob("*.parquet")))
    return r


def ours(args, work: Path, data: Path, tok: str) -> dict:
    out = work / "ours-out"
    r = vs.timed([str(Path(sys.executable).with_name("ultra3")), "data", "prep", "sft", "-c", "tiny",
                  f"datasets=[{{name: chat, path: {data}}}]", f"tokenizer={tok}", f"pack_size={args.pack_size}",
                  "valid_ratio=0", "test_ratio=0", "num_shards=16", f"output_dir={out}", "--force"],
                 dict(os.environ), REPO)
    r["totals"] = totals(sorted((out / "train").glob("*.parquet")))
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bridge-python", required=True, help="a Python with megatron-bridge 0.6.x (see above)")
    parser.add_argument("--conversations", type=int, default=10000)
    parser.add_argument("--pack-size", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bridge-workers", type=int, default=os.cpu_count(),
                        help="its num_tokenizer_workers (default: the CPUs; 1 or less: serial)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dir", default="/tmp/u3bench-sft-vs-bridge")
    args = parser.parse_args()
    found = subprocess.run([args.bridge_python, "-c", "import importlib.metadata as m; print(m.version("
                            "'megatron-bridge'), m.version('megatron-core'))"], capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"--bridge-python {args.bridge_python}: no megatron-bridge there "
                         f"({found.stderr.strip()[-200:]}); see this script's --help for a scratch venv")
    work = Path(args.dir)
    (work / "shim").mkdir(parents=True, exist_ok=True)
    (work / "shim" / "sitecustomize.py").write_text(vs.SHIM)
    data = corpus(work, args.conversations)
    tok = tokenizer(work, data, args.vocab)
    print(f"machine: {os.cpu_count()} CPUs; Megatron-Bridge and Megatron-Core {found.stdout.strip()} run by "
          f"{args.bridge_python}; ours by {sys.executable}; {args.conversations:,} conversations "
          f"({data.stat().st_size / 1e6:.0f} MB), pack {args.pack_size:,}", flush=True)
    runs: dict = {"bridge": [], "ours": []}
    for i in range(args.runs):
        for name, fn in (("bridge", bridge), ("ours", ours)):
            r = fn(args, work, data, tok)
            runs[name].append(r)
            extra = f", its own Elapsed {r['inner']:.2f} s" if name == "bridge" else ""
            print(f"  run {i + 1} {name}: {r['wall']:.2f} s ({args.conversations / r['wall']:,.0f} conversations/s), "
                  f"peak RSS {r['rss'] / 2**20:.0f} MiB{extra}; {r['totals']}", flush=True)
    b, u = runs["bridge"][-1]["totals"], runs["ours"][-1]["totals"]
    with open(data) as f:
        turns = sum(m["role"] == "assistant" for line in f for m in json.loads(line)["messages"])
    same = (b["sequences"], b["tokens"], b["loss_tokens"] - turns) == (u["sequences"], u["tokens"], u["loss_tokens"])
    walls = {k: [r["wall"] for r in v] for k, v in runs.items()}
    rate = {k: args.conversations / statistics.median(v) for k, v in walls.items()}
    print(f"\nmedian (min-max) of {args.runs} alternating runs each; whole process, start to exit\n")
    print(f"{'':>16} {'wall s':>20} {'conversations/s':>16} {'peak RSS MiB':>13} {'packs':>8} {'sequences':>10} "
          f"{'tokens':>12} {'loss tokens':>12}")
    for name, label in (("bridge", "Megatron-Bridge"), ("ours", "ultra3")):
        t = runs[name][-1]["totals"]
        print(f"{label:>16} {vs.cell(walls[name], '.2f'):>20} {rate[name]:>16,.0f} "
              f"{statistics.median(r['rss'] for r in runs[name]) / 2**20:>13.0f} {t['packs']:>8,} "
              f"{t['sequences']:>10,} "
              f"{t['tokens']:>12,} {t['loss_tokens']:>12,}")
    print(f"\nspeed-up {rate['ours'] / rate['bridge']:.2f}x; Megatron-Bridge's own Elapsed (without its imports) "
          f"{vs.cell([r['inner'] for r in runs['bridge']], '.2f')} s; sequences and tokens the same, loss tokens one "
          f"more per assistant turn ({turns:,}) in theirs: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
