"""The tiny quantize flow's wall time and peak memory (the runtime in a fresh process: imports, making the
checkpoint, calibration, accuracy check, export), and the bits per element a recipe gives any config.json
(no weights: the model is built on the meta device).

    python benchmarks/quantize.py                                  # the tiny flow on this machine
    python benchmarks/quantize.py --config-json path/config.json [--recipe NAME|PATH]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ULTRA = "models/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16/ptq/nvfp4-4o6"


def tiny_flow() -> None:
    cfg = yaml.safe_load((REPO / "configs/quantize/tiny.yaml").read_text())
    cfg.pop("defaults")
    with tempfile.TemporaryDirectory() as tmp:
        cfg.update(bf16_checkpoint=f"{tmp}/bf16", output_dir=f"{tmp}/out", modelopt_recipe=ULTRA, device="cpu",
                   seed=1234, tokenizer=str(REPO / cfg["tokenizer"]))
        cfg["calibration"]["path"] = str(REPO / cfg["calibration"]["path"])
        (Path(tmp) / "config.yaml").write_text(json.dumps(cfg))
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "recipes.quantize", "--config", f"{tmp}/config.yaml"],
                           capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t0
        if p.returncode:
            raise SystemExit(p.stdout + p.stderr)
        report = json.loads((Path(tmp) / "out/quantization_report.json").read_text())
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    t, acc = report["timings"], report["accuracy"]
    print(f"tiny flow: wall {wall:.1f} s (load {t['load_s']:.2f} s, calibrate {t['calibrate_s']:.2f} s, export "
          f"{t['export_s']:.2f} s, the rest imports and checkpoint making), peak RSS {peak:.0f} MiB")
    print(f"tiny flow: {report['parameters']:,} parameters, bits per element {report['bits_per_element']:.3f}, "
          f"relative logit error {acc['relative_logit_error']:.4f}, top-1 agreement {acc['top1_agreement']:.4f}")


def config_bits(config_json: str, recipe: str) -> None:
    sys.path.insert(0, str(REPO))  # the runtime package `recipes`
    from modelopt.recipe import load_recipe
    from transformers import AutoConfig

    from recipes.quantization import precision

    model = precision.plan(AutoConfig.from_pretrained(str(Path(config_json).parent)),
                           load_recipe(recipe).quantize.model_dump())
    print(precision.format_table(precision.summary(model)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", help="a Hugging Face config.json: print its bits per element and table")
    parser.add_argument("--recipe", default=ULTRA, help="a shipped ModelOpt recipe name or a recipe YAML")
    args = parser.parse_args()
    if args.config_json:
        config_bits(args.config_json, args.recipe)
    else:
        tiny_flow()


if __name__ == "__main__":
    main()
