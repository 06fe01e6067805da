"""The output directory of `ultra3 data prep sft`: kept when it already holds this very output, rebuilt
when it holds another, refused when it holds something else (the RL data prep's too); the finished
splits moved in from staging, metadata.json (the completion mark) last."""

from __future__ import annotations

import json
import os
import shutil

from .files import fsync_dir, write_json
from . import sft_output as out_
from .errors import DataPrepError
from .settings import Run
from .sft_settings import PROG, Settings

FORMAT = "ultra3-sft-packed-parquet/1"
STAGING = ".staging-"  # where a run writes its splits before they are moved in


def prepare_output(settings: Run, fp: str, fmt: str = FORMAT, names: tuple = (*out_.SPLITS, "packing_metadata.json"),
                   prog: str = PROG) -> bool:
    """False when output_dir already holds this very output (and not `force`); a DataPrepError when it holds
    something that is not a data-prep output of `fmt` (`names`: what one holds beside metadata.json). An
    output of other inputs or settings is rebuilt. The RL data prep uses it too, with its own format."""
    out, kind = settings.out, prog.rsplit(" ", 1)[-1].upper()
    meta = os.path.join(out, "metadata.json")
    if os.path.exists(meta):
        try:
            with open(meta, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict) or old.get("format") != fmt:
            raise DataPrepError(f"{meta} is not the metadata of an {kind} data-prep output; choose another output_dir")
        if old.get("fingerprint") == fp and not settings.force:
            return False
        if old.get("fingerprint") != fp:
            print(f"{prog}: {out} was prepared from other inputs or settings: rebuilding it", flush=True)
    elif os.path.isdir(out) and not settings.force:
        leftovers = [n for n in os.listdir(out) if n in names]
        if leftovers:
            raise DataPrepError(f"{out} holds an unfinished or foreign {kind} output ({', '.join(sorted(leftovers))} "
                                "without metadata.json); set force=true to replace it")
    return True


def publish(settings: Settings, staging: str, metadata: dict, mb_metadata: list) -> None:
    """Move the finished splits from staging into place; metadata.json, the completion mark, goes last."""
    out = settings.out
    meta = os.path.join(out, "metadata.json")
    if os.path.exists(meta):
        os.unlink(meta)
        fsync_dir(out)
    for name in (*out_.SPLITS, "packing_metadata.json"):
        target = os.path.join(out, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.unlink(target)
    for split in out_.SPLITS:
        src = os.path.join(staging, split)
        if os.path.isdir(src):
            os.replace(src, os.path.join(out, split))
    write_json(os.path.join(out, "packing_metadata.json"), mb_metadata)
    write_json(meta, metadata)
