"""ModelOpt's Hugging Face export with the fix-ups ModelOpt 0.47 needs for Nemotron-H:

* export packs the model's weights in place: evaluate before calling it;
* the HF model class drops the MTP weights on load: they are read from the source safetensors and passed
  through unquantized (and named in the ignore list);
* module names in hf_quant_config.json and config.json carry a sentinel suffix (transformers' reversed
  `backbone.` -> `model.` rename is applied as a regex that also matches inside the sentinel): stripped;
* the tokenizer is not exported: saved next to the weights."""

from __future__ import annotations

import glob
import json
import os
import re

from .. import quiet

SENTINEL = re.compile(r"\.\x00[^\x00]*?sentinel")  # e.g. ".\x00backbone.pt_name_sentinel"
QUANT_FILES = ("hf_quant_config.json", "config.json")


def mtp_weights(source: str) -> dict:
    """The `mtp.*` tensors of the source checkpoint's safetensors files."""
    from safetensors import safe_open

    out = {}
    for path in sorted(glob.glob(os.path.join(source, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys() if k.startswith("mtp.")})
    return out


def mtp_layer_prefixes(names) -> list[str]:
    return sorted({m.group(0) for n in names if (m := re.match(r"mtp\.layers\.\d+", n))})


def strip_sentinel(value):
    """`value` (parsed JSON) with the sentinel removed from every key and string."""
    if isinstance(value, dict):
        return {SENTINEL.sub("", k): strip_sentinel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_sentinel(v) for v in value]
    return SENTINEL.sub("", value) if isinstance(value, str) else value


def fix_sentinel_names(export_dir: str) -> int:
    """Strip the sentinel from the exported JSON files; the number of names that carried it."""
    fixed = 0
    for name in QUANT_FILES:
        path = os.path.join(export_dir, name)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        n = json.dumps(data).count("\\u0000")
        if n:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(strip_sentinel(data), f, indent=2)
        fixed += n
    return fixed


def export(model, tokenizer, source: str, out: str) -> dict:
    """Export `model` (calibrated, not yet packed) into `out`; what the fix-ups did."""
    from modelopt.torch.export import export_hf_checkpoint

    mtp = mtp_weights(source)
    model._mtp_layer_prefixes = mtp_layer_prefixes(mtp)
    with quiet.prints():  # the MTP layers it leaves unquantized
        export_hf_checkpoint(model, export_dir=out, extra_state_dict=mtp or None)
    tokenizer.save_pretrained(out)
    return {"mtp_tensors": len(mtp), "sentinel_names_fixed": fix_sentinel_names(out)}
