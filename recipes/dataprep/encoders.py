"""Encoders: the token ids of a batch of documents, each followed by EOD, as numpy arrays for the `.bin`.

Two implementations of the same function:

* `tokenizers` (Hugging Face): the reference. Every id the pipeline writes must be the one it gives
  (`encode_batch_fast`, `add_special_tokens=False`).
* `gigatoken`: the fast path (the Rust encoder Megatron-LM's fast preprocessing uses), many times faster
  per core. It loads only byte-level and SentencePiece-style BPE tokenizers, and is used only where it
  reproduces `tokenizers` exactly.

`encoder: auto` (the default) picks gigatoken when it imports, loads the tokenizer and gives the ids of
`tokenizers` on a calibration sample: TRICKY (unicode, whitespace runs, digits, emoji, control
characters) plus the text of every added token. The workers check it before their first shard (`choose`,
from shards.warm: where the shards are encoded), and every shard task checks the first CALIBRATION_HEAD
characters of the first CALIBRATION_DOCS documents of its shard, with TRICKY too in a process that has not
checked it yet (`ShardEncoder`). On any mismatch the run falls back to `tokenizers`, with one log line
saying why. `encoder: gigatoken` makes a mismatch an error; `encoder: tokenizers` never uses gigatoken.
The shards' bytes are the same whichever encoder wrote them, so the encoder is not part of the plan hash,
the receipts or the manifest.
"""

from __future__ import annotations

import itertools
import json

import numpy as np

from .errors import DataPrepError

MODES = ("auto", "gigatoken", "tokenizers")
CALIBRATION_DOCS = 32  # a shard's check: the heads of its first documents
CALIBRATION_HEAD = 256  # characters
TRICKY = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  two leading spaces, three   inside,\ttabs\t\tand trailing   ",
    "\n\nnewlines\n\n\n\r\nCRLF\r\n \n \t \u00a0nbsp\u2003em-space\u3000ideographic space",
    "digits 0 7 42 1234567890 3.14159 -2.5e-10 1,000,000 ١٢٣ ৪৫৬ 0x1F 2024-01-31T12:00:00Z",
    "emoji 😀 👍🏽 🇫🇷 👨‍👩‍👧‍👦 ❤️ 🏳️‍🌈 ☃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "ünïcödé café naïve Ǆǅǆ ﬁﬂ Å Å é é ß ẞ İı ς σ Σ",
    "日本語のテキスト、中文文本。한국어 텍스트 ไทย العربية עברית हिन्दी ქართული Ελληνικά Русский",
    "control \x00\x01\x07\x1b[31m \x7f\u200b\u200c\u200d\u2028\u2029\ufeff\ufffd end",
    "code: def f(x):\n    return x**2  # comment\n\tif (a && b) { c += 1; }  <div class=\"x\">&amp;</div>",
    "URLs https://example.com/a?b=c&d=e#f mail@example.org @user #tag $100 50% a/b\\c",
    "repeated " + "a" * 300 + " " + "ab" * 150 + " " + "!" * 200 + " " + "-=" * 100,
    "'s 're 've 'm 'll 'd n't 'S 'RE CAPS lower MiXeD camelCase snake_case kebab-case",
    " ",
    "x",
)


class EncoderError(DataPrepError):
    """`encoder: gigatoken`, and gigatoken cannot reproduce the ids of `tokenizers`."""


def with_eod(flat: np.ndarray, counts: np.ndarray, eod_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(ids of every document followed by EOD, back to back; lengths, EOD included) from the documents'
    ids back to back (`flat`) and their counts."""
    lengths = counts.astype(np.int64) + 1
    ends = np.cumsum(lengths) - 1  # where each EOD goes
    out = np.empty(int(ends[-1]) + 1 if ends.size else 0, dtype=dtype)
    keep = np.ones(out.size, dtype=bool)
    keep[ends] = False
    out[keep] = flat
    out[ends] = eod_id
    return out, lengths


def as_list(texts) -> list[str]:
    """The documents as Python strings (`texts`: a list of them, or a pyarrow string array)."""
    return texts if isinstance(texts, list) else texts.to_pylist()


class HFEncoder:
    name = "tokenizers"

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_json)

    def ids(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """(ids back to back as uint32, count per document) of a list of str or a pyarrow string array."""
        return _flatten([e.ids for e in self.tok.encode_batch_fast(as_list(texts), add_special_tokens=False)])

    def encode(self, texts, eod_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        return with_eod(*self.ids(texts), eod_id, dtype)


class GigatokenEncoder:
    name = "gigatoken"
    tricky_checked = False  # gave the ids of tokenizers on tricky_texts (this instance: cached per process)

    def __init__(self, tokenizer_json: str, parallel: bool = False) -> None:
        import gigatoken

        self.version = getattr(gigatoken, "__version__", None) or _version("gigatoken")
        self.backend = gigatoken.Tokenizer.from_json(tokenizer_json).backend
        self.parallel = parallel

    def ids(self, texts) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(texts, list):  # a pyarrow string array: its buffers, with no Python object per text
            texts = _awkward_strings(texts)
        batch = self.backend.encode_batch(texts, parallel=self.parallel)  # an awkward Array, var * uint32
        layout = batch.layout
        if type(layout).__name__ == "ListOffsetArray":  # the usual form: read its two buffers directly
            offsets = np.asarray(layout.offsets)
            flat = np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
            return flat, np.diff(offsets)
        import awkward as ak

        return ak.to_numpy(ak.flatten(batch, axis=1)), ak.num(batch, axis=1).to_numpy()

    def encode(self, texts, eod_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        return with_eod(*self.ids(texts), eod_id, dtype)


def _awkward_strings(texts):
    """A pyarrow string array without nulls as the awkward array of strings gigatoken reads in place (it wants
    64-bit offsets)."""
    import awkward as ak
    import pyarrow as pa

    texts = texts.cast(pa.large_string())
    offsets = np.frombuffer(texts.buffers()[1], np.int64)[texts.offset:texts.offset + len(texts) + 1]
    chars = np.frombuffer(texts.buffers()[2] or b"", np.uint8)
    return ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(offsets),
                                                ak.contents.NumpyArray(chars, parameters={"__array__": "char"}),
                                                parameters={"__array__": "string"}))


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def tricky_texts(tokenizer_json: str) -> list[str]:
    """TRICKY plus the text of every added (special or not) token, alone and inside words and spaces."""
    try:
        added = [t["content"] for t in json.loads(tokenizer_json).get("added_tokens") or [] if t.get("content")]
    except (ValueError, AttributeError, TypeError):
        added = []
    texts = list(TRICKY)
    for i in range(0, len(added), 32):
        group = added[i:i + 32]
        texts.append("".join(group))
        texts.append(" ".join(f"a{t}b  {t}\n{t} " for t in group))
    return texts


def first_difference(want: tuple, got: tuple, texts: list[str]) -> str | None:
    """None when the two (flat, counts) are equal; else which document differs, in words."""
    (wf, wc), (gf, gc) = want, got
    if np.array_equal(wc, gc) and np.array_equal(wf, gf):
        return None
    starts = np.concatenate(([0], np.cumsum(wc)))
    gstarts = np.concatenate(([0], np.cumsum(gc))) if len(gc) == len(wc) else None
    for i, text in enumerate(texts):
        if gstarts is None or i >= len(gc) or not np.array_equal(wf[starts[i]:starts[i + 1]],
                                                                  gf[gstarts[i]:gstarts[i + 1]]):
            return f"gigatoken's ids differ from tokenizers' on {text[:40]!r}{'...' if len(text) > 40 else ''}"
    return "gigatoken's ids differ from tokenizers'"


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32, count=int(counts.sum())), counts


def choose(mode: str, tokenizer_json: str, sha: str) -> tuple[str, str | None]:
    """The run's check, made in a worker before the first shard (shards.warm): (encoder to use, why gigatoken
    is not used or None). `mode: gigatoken` and gigatoken unusable: an EncoderError."""
    if mode == "tokenizers":
        return "tokenizers", None
    why = None
    try:
        fast = _cached("gigatoken", tokenizer_json, sha)
    except ImportError as e:
        why = f"gigatoken is not installed ({_first_line(e)})"
    except Exception as e:  # gigatoken refuses what it cannot encode: another model, normalizer, pre-tokenizer
        why = f"gigatoken cannot load this tokenizer ({_first_line(e)})"
    else:
        texts = _tricky(tokenizer_json, sha)
        try:
            why = first_difference(_cached("tokenizers", tokenizer_json, sha).ids(texts), fast.ids(texts), texts)
        except Exception as e:
            why = f"gigatoken failed on the calibration strings ({_first_line(e)})"
    if why is None:
        fast.tricky_checked = True
        return "gigatoken", None
    if mode == "gigatoken":
        raise EncoderError(f"encoder: gigatoken cannot be used: {why} (encoder: auto falls back to tokenizers)")
    return "tokenizers", why


# ---- inside a shard task ---------------------------------------------------------------------------------

_CACHE: dict = {}  # (kind, tokenizer sha, parallel) -> encoder, per worker process (Ray reuses workers)
_TRICKY: dict = {}  # tokenizer sha -> tricky_texts


def _tricky(tokenizer_json: str, sha: str) -> list[str]:
    if sha not in _TRICKY:
        _TRICKY.clear()
        _TRICKY[sha] = tricky_texts(tokenizer_json)
    return _TRICKY[sha]


def _cached(kind: str, tokenizer_json: str, sha: str, parallel: bool = False):
    key = (kind, sha, parallel)
    enc = _CACHE.get(key)
    if enc is None:
        if len(_CACHE) > 4:
            _CACHE.clear()
        enc = _CACHE[key] = (GigatokenEncoder(tokenizer_json, parallel) if kind == "gigatoken"
                             else HFEncoder(tokenizer_json))
    return enc


class ShardEncoder:
    """The encoder of one shard task: `tokenizers`, or gigatoken once it has reproduced the ids of
    `tokenizers` on TRICKY and the shard's first documents (the first batch given to `encode`)."""

    def __init__(self, kind: str, tokenizer_json: str, sha: str, threads: int = 1, required: bool = False) -> None:
        self.tokenizer_json, self.sha, self.required = tokenizer_json, sha, required
        self.fallback: str | None = None  # why gigatoken was dropped, when it was
        self.reference = _cached("tokenizers", tokenizer_json, sha)
        self.enc = self.reference
        self.pending = False  # gigatoken is still to be checked on the first batch
        if kind == "gigatoken":
            try:
                self.enc = _cached("gigatoken", tokenizer_json, sha, threads > 1)
                self.pending = True
            except ImportError as e:  # a worker without it (a cluster whose nodes differ from the driver's)
                self._drop(f"gigatoken is not installed on this worker ({_first_line(e)})")
            except Exception as e:
                self._drop(f"gigatoken cannot load this tokenizer ({_first_line(e)})")

    @property
    def name(self) -> str:
        return self.enc.name

    def _drop(self, why: str) -> None:
        if self.required:
            raise EncoderError(f"encoder: gigatoken cannot be used: {why}")
        self.fallback, self.enc, self.pending = why, self.reference, False

    def _calibrate(self, texts) -> None:
        self.pending = False
        sample = [text[:CALIBRATION_HEAD] for text in as_list(texts[:CALIBRATION_DOCS])]
        tricky = not self.enc.tricky_checked  # (the same strings give the same ids: once per encoder)
        if tricky:
            sample += _tricky(self.tokenizer_json, self.sha)
        try:
            why = first_difference(self.reference.ids(sample), self.enc.ids(sample), sample)
        except Exception as e:
            why = f"gigatoken failed ({_first_line(e)})"
        if why is not None:
            self._drop(f"on this shard's calibration sample, {why}")
        elif tricky:
            self.enc.tricky_checked = True

    def encode(self, texts, eod_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        if self.pending:
            self._calibrate(texts)
        return self.enc.encode(texts, eod_id, dtype)
