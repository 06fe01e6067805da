"""Files written whole or not at all: temporary names beside the final ones, atomic writes, directory fsyncs,
and content digests. Stdlib only (the image build job uses them outside any image)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid

TMP_MARK = ".tmp-"


def tmp_name(path: str) -> str:
    return f"{path}{TMP_MARK}{uuid.uuid4().hex[:12]}"


def fsync_file(path: str) -> None:
    """fsync a file by its path: its data and size, whichever process on this machine wrote them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: readers see the old or the new file."""
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")


def missing_dirs(path: str) -> list[str]:
    """`path` and its missing parents, deepest first."""
    missing = []
    while path and not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def remove_temporary(root: str) -> None:
    """Remove every file under `root` still under a temporary name: writes that did not finish."""
    for folder, _, names in os.walk(root):
        for name in names:
            if TMP_MARK in name:
                try:
                    os.unlink(os.path.join(folder, name))
                except FileNotFoundError:
                    pass


def write_json(path: str, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode())


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()
