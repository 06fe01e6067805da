#!/usr/bin/env python3
"""nvcc that compiles for the GPU architectures in $ULTRA3_CUDA_ARCHS only (e.g. "90,100"): it drops the other
-gencode options an extension's setup.py hard-codes, then runs the real nvcc ($ULTRA3_REAL_NVCC)."""

import os
import re
import sys

KEEP = set(os.environ.get("ULTRA3_CUDA_ARCHS", "90").split(","))


def wanted(spec: str) -> bool:
    match = re.search(r"arch=compute_(\d+)", spec)
    return match is None or match.group(1) in KEEP


def filtered(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        if args[i] in ("-gencode", "--generate-code") and i + 1 < len(args):
            out += args[i:i + 2] if wanted(args[i + 1]) else []
            i += 2
            continue
        if not (args[i].startswith(("-gencode=", "--generate-code=")) and not wanted(args[i])):
            out.append(args[i])
        i += 1
    return out


if __name__ == "__main__":
    real = os.environ["ULTRA3_REAL_NVCC"]
    os.execv(real, [real, *filtered(sys.argv[1:])])
