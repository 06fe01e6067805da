"""Runtime of `ultra3 convert hf-to-megatron` and `ultra3 convert megatron-to-hf`: a Nemotron-H checkpoint from
Hugging Face into Megatron-Bridge and back, with Megatron-Bridge's AutoBridge on the torchrun ranks, gated by the
logits of the converted model against its source's on held-out tokens.

    python -m recipes.convert --config config.yaml

Started by recipes.launch under torchrun (job.stage names the direction: "convert hf-to-megatron" or
"convert megatron-to-hf"; a config written by hand gives `job: {stage: ...}`). The Megatron side needs the training
container (Megatron-Bridge, Transformer Engine, mamba_ssm) and a GPU per rank; the checks before it need neither.

Config keys (every one must be there, as the launcher compiles them; others are ignored):

    hf_model: DIR|NAME|null    # hf-to-megatron: the source; megatron-to-hf: the model whose config.json and
                               # tokenizer the export takes (null: <checkpoint>/hf_reference, else the training
                               # job's recipe.hf_model or model keys)
    megatron_checkpoint: DIR   # megatron-to-hf only: the source (a tracker file and iter_NNNNNNN/)
    output_dir: DIR            # new or empty; written as <output_dir>.partial and renamed when the gate passes
    make_checkpoint: false     # hf-to-megatron only: build a seeded random hf_model of `model` first (-c tiny)
    tokenizer: FILE|null       # hf-to-megatron only: tokenizer.json of a made checkpoint
    seed: 1234
    parity: {tokens: 1024, data: JSONL, max_relative_error: 0.02, min_top1: 0.99}
    model: {...}               # Megatron-Bridge names: the parallel layout (tensor/pipeline/expert_model_parallel_
                               # size, expert_tensor_parallel_size) and the shape of a made checkpoint

Output (output_dir): hf-to-megatron, the Megatron-Bridge checkpoint plus hf_reference/ (the source's config.json and
tokenizer, so megatron-to-hf needs no hf_model); megatron-to-hf, the Hugging Face checkpoint. Both hold
conversion_report.json (direction, source, parity figures, seconds, versions).

Exit codes: 0 done; 2 a config or input problem (one line on stderr, nothing written: a missing or non-Nemotron-H
hf_model, a checkpoint without tracker or iteration, a checkpoint whose run_config.yaml disagrees with the Hugging
Face config.json, an output_dir holding something, no Megatron-Bridge or GPU here); 1 the parity gate failed (one
line; the converted checkpoint is kept at <output_dir>.failed-parity) or anything else (with its traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from . import quiet
from .contract import CONVERSION_REPORT, INPUT_ERROR_EXIT
from .conversion.checks import REFERENCE, STAGES, ConvertError, is_local, precheck, settings
from .conversion.parity import Parity, ParityFailed, held_out_ids, hf_logits, parity
from .dataprep.errors import DataPrepError
from .dataprep.settings import load_config
from .quantization import megatron_export

LOG = "ultra3 convert"
REPORT = CONVERSION_REPORT
REFERENCE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "tokenizer.model")
LAYOUT = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
          "expert_tensor_parallel_size")
VERSIONS = ("torch", "transformers", "megatron-core", "megatron-bridge", "transformer-engine", "mamba-ssm")


def log(message: str) -> None:
    print(f"{LOG}: {message}", flush=True)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


# -- the Megatron side (training container, a GPU per rank) ---------------------------------------------------------


def auto_bridge():
    try:
        from megatron.bridge import AutoBridge
    except ImportError as e:
        raise ConvertError(f"megatron.bridge cannot be imported here ({e}); run in the training container "
                           "(a profile whose image has Megatron-Bridge)") from None
    import torch

    if not torch.cuda.is_available():
        raise ConvertError("no GPU is visible, and the Megatron side needs one per rank; set run.gpus_per_node")
    return AutoBridge


def init_dist() -> None:
    """This rank's GPU and the job's process group (a long wait for rank 0's Hugging Face side is no hang)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)  # run by hand: one rank
    if "MASTER_PORT" not in os.environ:
        from .nodes import free_port

        os.environ["MASTER_PORT"] = str(free_port("127.0.0.1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", timeout=timedelta(hours=2))


def parallel(bridge, s: dict, load_weights: bool):
    """The bridge's model provider at model.*'s layout, with the model-parallel state set up; and the layout."""
    layout = {k: s["model"][k] for k in LAYOUT if s["model"].get(k) is not None}
    provider = bridge.to_megatron_provider(load_weights=load_weights)
    for key, value in layout.items():
        setattr(provider, key, value)
    provider.finalize()
    provider.initialize_model_parallel(seed=s["seed"])
    return provider, layout


def megatron_logits(model, ids, vocab_size: int):
    """The Megatron model's logits [tokens, vocab_size] on `ids` (float32, CPU) on rank 0, None elsewhere; the
    last pipeline stage of rank 0's pipeline sends them."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    ids = ids.cuda()
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)

    def step(_data, chunk):
        return chunk(input_ids=ids, position_ids=positions, attention_mask=None, runtime_gather_output=True), None

    for chunk in model:
        chunk.eval()
    with torch.no_grad():
        outputs = get_forward_backward_func()(forward_step_func=step, data_iterator=None, model=model,
                                              num_microbatches=1, seq_length=ids.shape[1],
                                              micro_batch_size=ids.shape[0], forward_only=True)
    logits = outputs[0][..., :vocab_size].float().reshape(-1, vocab_size).contiguous() if outputs else None
    last = parallel_state.get_pipeline_model_parallel_last_rank()
    if parallel_state.get_pipeline_model_parallel_first_rank() == 0 and last != 0:
        if rank() == last:
            dist.send(logits, dst=0)
        elif rank() == 0:
            logits = torch.empty(ids.numel(), vocab_size, device=ids.device)
            dist.recv(logits, src=last)
    return logits.cpu() if rank() == 0 else None


def import_checkpoint(bridge, s: dict, dest: str, ids, vocab_size: int):
    """HF -> Megatron into `dest`, on every rank; the saved checkpoint's logits, reloaded (rank 0)."""
    bridge = bridge.from_hf_pretrained(s["hf_model"])
    provider, layout = parallel(bridge, s, load_weights=True)
    model = provider.provide_distributed_model(wrap_with_ddp=False)
    bridge.save_megatron_model(model, dest, hf_tokenizer_path=s["hf_model"], low_memory_save=True,
                               hf_tokenizer_kwargs={"use_fast": True})
    del model
    return megatron_logits(bridge.load_megatron_model(dest, mp_overrides=layout, wrap_with_ddp=False), ids, vocab_size)


def export_checkpoint(bridge, s: dict, reference: str, dest: str, ids, vocab_size: int):
    """Megatron -> HF into `dest`, on every rank (rank 0 writes the config and tokenizer); the Megatron logits."""
    bridge = bridge.from_auto_config(megatron_path=s["megatron_checkpoint"], hf_model_id=reference)
    _, layout = parallel(bridge, s, load_weights=False)
    model = bridge.load_megatron_model(s["megatron_checkpoint"], mp_overrides=layout, wrap_with_ddp=False)
    logits = megatron_logits(model, ids, vocab_size)
    bridge.save_hf_pretrained(model, dest, show_progress=False, strict=False)
    return logits


def release_gpus() -> None:
    """Every rank frees its GPU memory, so rank 0's Hugging Face model has the node's GPUs."""
    import gc

    import torch
    import torch.distributed as dist

    gc.collect()
    torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()


# -- the flow -------------------------------------------------------------------------------------------------------


def copy_reference(hf_model: str, dest: str) -> None:
    """The source's config.json and tokenizer files into `dest`."""
    if is_local(hf_model):
        os.makedirs(dest)
        for name in REFERENCE_FILES:
            if os.path.isfile(os.path.join(hf_model, name)):
                shutil.copy2(os.path.join(hf_model, name), dest)
    else:
        from huggingface_hub import snapshot_download

        snapshot_download(hf_model, allow_patterns=list(REFERENCE_FILES), local_dir=dest)


def prepare(s: dict, plan: dict) -> str:
    """Rank 0 makes what the ranks read (the tiny checkpoint, a reference from the training job); the Hugging Face
    model the held-out tokens and the vocab come from."""
    import torch.distributed as dist

    if s["direction"] == "hf-to-megatron":
        if rank() == 0 and s["make_checkpoint"] and not os.path.isdir(s["hf_model"]):
            from .quantization import tiny_checkpoint

            tiny_checkpoint.make(s["model"], s["tokenizer"], s["hf_model"], s["seed"])
            log(f"made the tiny Hugging Face checkpoint {s['hf_model']}")
    elif plan["train"]:
        plan["reference"] = os.path.join(s["job_dir"], REFERENCE)
        if rank() == 0:
            megatron_export.reference_model(*plan["train"], plan["reference"], "megatron_checkpoint")
    dist.barrier()
    return s["hf_model"] if s["direction"] == "hf-to-megatron" else plan["reference"]


def convert(bridge, s: dict, plan: dict, partial: str):
    """Convert into `partial` on every rank; on rank 0 (source logits, converted logits, vocab size)."""
    from transformers import AutoConfig

    init_dist()
    hf_side = prepare(s, plan)
    vocab = AutoConfig.from_pretrained(hf_side).vocab_size
    ids = held_out_ids(s["parity"]["data"], hf_side, s["parity"]["tokens"])
    if s["direction"] == "hf-to-megatron":
        converted = import_checkpoint(bridge, s, partial, ids, vocab)
        if rank() == 0:
            copy_reference(s["hf_model"], os.path.join(partial, REFERENCE))
    else:
        megatron = export_checkpoint(bridge, s, plan["reference"], partial, ids, vocab)
    release_gpus()
    if rank():
        return None
    if s["direction"] == "hf-to-megatron":
        return hf_logits(hf_side, ids), converted, vocab
    return megatron, hf_logits(partial, ids), vocab


def versions() -> dict:
    from importlib import metadata

    found = {}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def finish(s: dict, partial: str, measured: Parity, started: float) -> None:
    """The report into `partial`, then the gate: `partial` becomes output_dir, or <output_dir>.failed-parity."""
    limits = {k: s["parity"][k] for k in ("max_relative_error", "min_top1")}
    failures = measured.failures(**limits)
    source = s["hf_model"] if s["direction"] == "hf-to-megatron" else s["megatron_checkpoint"]
    report = {"direction": s["direction"], "source": source, "output": s["output_dir"],
              "parity": {**vars(measured), **limits, "passed": not failures},
              "seconds": round(time.time() - started, 1), "versions": versions()}
    with open(os.path.join(partial, REPORT), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    log(f"parity: relative error {measured.relative_error:.4g}, top-1 {measured.top1:.4f} over {measured.tokens} "
        f"tokens (limits {limits['max_relative_error']:g}, {limits['min_top1']:g})")
    if failures:
        failed = f"{s['output_dir'].rstrip('/')}.failed-parity"
        shutil.rmtree(failed, ignore_errors=True)
        os.replace(partial, failed)
        raise ParityFailed(f"{'; '.join(failures)} over {measured.tokens} tokens; the converted checkpoint is kept "
                           f"at {failed} for inspection, {s['output_dir']} is not written")
    os.replace(partial, s["output_dir"])  # an empty output_dir is replaced
    log(f"wrote {s['output_dir']} in {time.time() - started:.0f} s")


def fresh_partial(output_dir: str) -> str:
    """<output_dir>.partial, where the conversion writes; a killed run's is removed first (by rank 0, before the
    ranks meet)."""
    partial = f"{output_dir.rstrip('/')}.partial"
    if rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    return partial


def run(config_path: str) -> int:
    started = time.time()
    s = settings(load_config(config_path))
    plan = precheck(s)
    if plan["note"]:
        log(plan["note"])
    bridge = auto_bridge()
    partial = fresh_partial(s["output_dir"])
    logits = convert(bridge, s, plan, partial)
    if logits is not None:  # rank 0
        finish(s, partial, parity(*logits), started)
    return 0


def prog(config_path: str) -> str:
    """`ultra3 convert <direction>` of the config, for the error line."""
    try:
        stage = (load_config(config_path).get("job") or {}).get("stage")
    except DataPrepError:
        stage = None
    return f"ultra3 {stage}" if stage in STAGES else LOG


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the resolved stage config (YAML)")
    args = parser.parse_args(argv)
    quiet.install()
    try:
        return run(args.config)
    except DataPrepError as e:  # ConvertError, or the config unreadable: every rank finds it, rank 0 says it
        if rank() == 0:
            print(f"{prog(args.config)}: error: {e}", file=sys.stderr, flush=True)
        return INPUT_ERROR_EXIT
    except ParityFailed as e:
        print(f"{LOG}: parity failed: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
