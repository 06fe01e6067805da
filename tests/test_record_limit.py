"""max_record_bytes: a line longer than the limit is a bad record (too_long), dropped as it streams by, so the
memory a reader holds stays bounded whatever the length of a line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from recipes.dataprep import inputs, line_reader
from recipes.dataprep.errors import BadRecordError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny"


def split(data: bytes, max_bytes: int) -> list:
    return list(line_reader.lines(io.BytesIO(data), max_bytes))


@pytest.mark.parametrize("block", [3, 7, 1 << 20])
def test_lines_are_those_of_the_file_and_long_ones_are_none(monkeypatch, block):
    monkeypatch.setattr(line_reader, "BLOCK_BYTES", block)  # lines and overlong lines across block edges
    assert split(b"a\nbb\n\nccc", 5) == [b"a", b"bb", b"", b"ccc"]
    assert split(b"a\n" + b"x" * 30 + b"\nb\n", 5) == [b"a", None, b"b"]
    assert split(b"x" * 30, 5) == [None]
    assert split(b"12345\n123456\n", 5) == [b"12345", None]
    assert split(b"abc\r\ndef\n", 100) == [b"abc\r", b"def"]  # only \n ends a line, as in file iteration
    assert split(b"", 5) == [] and split(b"\n", 5) == [b""]
    corpus = b"".join(json.dumps({"text": f"doc {i} " * i}).encode() + b"\n" for i in range(50))
    assert split(corpus, 1 << 20) == corpus.splitlines()


def corpus_with_a_long_line(path: Path, line_bytes: int) -> list[str]:
    """Three documents around one of `line_bytes` bytes with no whitespace; the three."""
    docs = ["first document", "second one", "third and last"]
    with open(path, "wb") as f:
        f.write(json.dumps({"text": docs[0]}).encode() + b"\n")
        f.write(b'{"text": "')
        chunk = b"y" * (1 << 20)
        for _ in range(line_bytes >> 20):
            f.write(chunk)
        f.write(b'"}\n')
        for d in docs[1:]:
            f.write(json.dumps({"text": d}).encode() + b"\n")
    return docs


def test_a_long_line_is_counted_and_never_held(tmp_path, monkeypatch):
    corpus = tmp_path / "c.jsonl"
    docs = corpus_with_a_long_line(corpus, 256 << 20)
    assert inputs.count_records(str(corpus), "jsonl", "text")[:2] == (4, True)
    monkeypatch.setattr(line_reader, "BLOCK_BYTES", 1 << 20)
    (tmp_path / "warm.jsonl").write_text('{"text": "imports done before measuring"}\n')
    list(inputs.read_texts(str(tmp_path / "warm.jsonl"), "jsonl", "text", 0, 1, inputs.BadRecords()))
    bad = inputs.BadRecords()
    tracemalloc.start()
    texts = [t for _, block in inputs.read_texts(str(corpus), "jsonl", "text", 0, 4, bad, 1 << 20)
             for t in block.to_pylist()]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert texts == docs
    assert bad.counts == {"too_long": 1}
    assert bad.examples["too_long"] == [f"{corpus}:2: longer than max_record_bytes (1,048,576 bytes)"]
    # a block read, its cut and its split lines at once, plus the limit: ~5 MiB for 1 MiB blocks and limit
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB reading a 256 MiB line"
    with pytest.raises(BadRecordError, match=r"bad record \(too_long\) at .*c.jsonl:2: longer than"):
        list(inputs.read_texts(str(corpus), "jsonl", "text", 0, 4, inputs.BadRecords(strict=True), 1 << 20))


def test_parquet_texts_over_the_limit_are_bad_records(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"t": ["short", "x" * 100, None, "also short"]}), path)
    bad = inputs.BadRecords()
    texts = [t for _, block in inputs.read_texts(str(path), "parquet", "t", 0, 4, bad, 50) for t in block.to_pylist()]
    assert texts == ["short", "also short"]
    assert bad.counts == {"missing_field": 1, "too_long": 1}
    assert bad.examples["too_long"] == [f"{path}:row=1: longer than max_record_bytes (50 bytes)"]


SHARD = """
import hashlib, json, resource, sys
from recipes.dataprep import inputs, shards
corpus, out, tok_path = sys.argv[1:4]
tok_json = open(tok_path).read()
sha = hashlib.sha256(tok_json.encode()).hexdigest()
task = shards.plan_dataset("d", out, "text", [inputs.scan(corpus, "jsonl", "text")], 1, sha, 0, "uint16",
                           inputs.MAX_RECORD_BYTES)[0]
receipt = shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="tokenizers")
print(json.dumps({"bad": receipt["bad"]["counts"],
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "bin": hashlib.sha256(open(task.prefix + ".bin", "rb").read()).hexdigest()}))
"""


@pytest.mark.heavy
def test_a_1_gib_single_line_document_leaves_a_shard_task_peak_memory_where_it_was(tmp_path):
    """A real shard task, in its own process, over the same three documents with and without a 1 GiB
    single-line document between them: the same shard bytes, the long one counted, and the same peak RSS
    within the reader's bound (8 MiB blocks + the 16 MiB default limit)."""
    runs = {}
    for name, size in (("plain", 0), ("huge", 1 << 30)):
        corpus = tmp_path / f"{name}.jsonl"
        if size:
            corpus_with_a_long_line(corpus, size)
        else:
            corpus.write_text("".join(json.dumps({"text": d}) + "\n"
                                      for d in ["first document", "second one", "third and last"]))
        r = subprocess.run([sys.executable, "-c", SHARD, str(corpus), str(tmp_path / name),
                            str(TINY / "tokenizer.json")],
                           capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout)
        corpus.unlink()
    assert runs["plain"]["bad"] == {} and runs["huge"]["bad"] == {"too_long": 1}
    assert runs["huge"]["bin"] == runs["plain"]["bin"]
    grew = runs["huge"]["peak_mib"] - runs["plain"]["peak_mib"]
    assert grew < 64, f"peak RSS {runs['plain']['peak_mib']:.0f} MiB -> {runs['huge']['peak_mib']:.0f} MiB"
