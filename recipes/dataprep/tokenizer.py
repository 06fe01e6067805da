"""The tokenizer: a Hugging Face `tokenizer.json`, from a local file or directory or a hub model id, its EOD
token and the token dtype of the shards.

* `tokenizer: /path/to/tokenizer.json`, `tokenizer: /path/to/dir` (holding tokenizer.json) or
  `tokenizer: org/name[@revision]` (fetched with huggingface_hub; a local path wins over a hub id).
* EOD: `eod_token` when set, else the `eos_token` of the `tokenizer_config.json` beside it, else the first
  of COMMON_EOS that is a special token of the vocabulary. It is appended to every document; no BOS or
  other special tokens are added (documents are encoded with `add_special_tokens=False`).
* dtype: uint16 when the vocabulary (largest id + 1) is < 65,500, else int32 (Megatron's rule).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

from ..contract import HUB_MODEL
from .errors import DataPrepError

COMMON_EOS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>")
UINT16_LIMIT = 65500


@dataclass
class TokenizerInfo:
    source: str  # as configured
    path: str  # the tokenizer.json read
    sha256: str  # of tokenizer.json
    revision: str | None  # hub commit, for hub tokenizers
    vocab_size: int  # largest token id + 1
    eod_token: str
    eod_id: int
    dtype: str  # numpy dtype name of the shards: uint16 or int32

    def describe(self) -> dict:
        d = asdict(self)
        d.pop("path")
        return d


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataPrepError(f"{what} {path} is not readable ({type(e).__name__}: {e})") from None


def load(spec: str, eod_token: str | None = None, cache_dir: str | None = None) -> tuple[TokenizerInfo, str]:
    """(info, tokenizer.json text) of the configured tokenizer; a DataPrepError when it cannot be used."""
    from tokenizers import Tokenizer

    if not spec:
        raise DataPrepError("tokenizer is not set (a tokenizer.json, a directory holding one, or a hub model id)")
    local = os.path.expanduser(spec)
    revision = None
    if os.path.isdir(local):
        path = os.path.join(local, "tokenizer.json")
        if not os.path.isfile(path):
            raise DataPrepError(f"tokenizer directory {spec} has no tokenizer.json")
        config_path = os.path.join(local, "tokenizer_config.json")
    elif os.path.exists(local):
        path = local
        config_path = os.path.join(os.path.dirname(os.path.abspath(local)), "tokenizer_config.json")
    elif HUB_MODEL.match(spec) and not spec.startswith((".", "/", "~")):
        from .hub import download_tokenizer

        path, config_path, revision = download_tokenizer(spec, cache_dir)
    else:
        raise DataPrepError(f"tokenizer {spec} does not exist (a tokenizer.json, a directory holding one, "
                            "or a hub model id org/name)")
    text = _read(path, "tokenizer")
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:
        raise DataPrepError(f"tokenizer {path} is not a readable tokenizer.json ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values()) + 1 if vocab else 0
    eod = eod_token or _configured_eos(config_path) or _common_eos(tok)
    if eod is None:
        raise DataPrepError(f"cannot tell the EOS token of tokenizer {spec} (no tokenizer_config.json eos_token, "
                            f"none of {', '.join(COMMON_EOS)}): set eod_token")
    eod_id = tok.token_to_id(eod)
    if eod_id is None:
        raise DataPrepError(f"eod_token {eod!r} is not in the vocabulary of tokenizer {spec}")
    info = TokenizerInfo(source=spec, path=os.path.abspath(path), sha256=hashlib.sha256(text.encode()).hexdigest(),
                         revision=revision, vocab_size=vocab_size, eod_token=eod, eod_id=eod_id,
                         dtype="uint16" if vocab_size < UINT16_LIMIT else "int32")
    return info, text


def _configured_eos(config_path: str | None) -> str | None:
    if not config_path or not os.path.isfile(config_path):
        return None
    try:
        config = json.loads(_read(config_path, "tokenizer config"))
    except ValueError as e:
        raise DataPrepError(f"tokenizer config {config_path} is not valid JSON ({e})") from None
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):  # AddedToken serialised
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def _common_eos(tok) -> str | None:
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    return next((t for t in COMMON_EOS if t in special), None)
