"""The settings of `ultra3 data prep sft`: its config, checked, with one line per bad value."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DataPrepError
from .settings import Common, Dataset, bool_value, common_values, dataset_entries, int_value, str_value

PROG = "ultra3 data prep sft"


@dataclass
class Settings(Common):
    chat_template: str
    pack_size: int
    pad_seq_to_mult: int
    truncate: bool
    valid_ratio: float
    test_ratio: float
    seed: int
    row_group_size: int | None


# ---- config --------------------------------------------------------------------------------------------

def _ratio(cfg: dict, key: str, default: float) -> float:
    value = cfg.get(key, default)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise DataPrepError(f"{key} must be a number in [0, 1), not {value!r}")
    return float(value)


def parse_settings(cfg: dict) -> Settings:
    if not isinstance(cfg, dict):
        raise DataPrepError("the config is not a mapping")
    datasets = [Dataset(*d) for d in dataset_entries(cfg, "messages_field", "messages",
                                                         "the conversation sets to pack ({name, path, weight})")]
    pack_size = cfg.get("pack_size")
    if pack_size is None:
        raise DataPrepError("pack_size is not set (tokens per pack: the training sequence length)")
    pack_size = int_value(cfg, "pack_size", None, 2)
    mult = int_value(cfg, "pad_seq_to_mult", 1, 1)
    if pack_size % mult:
        raise DataPrepError(f"pack_size {pack_size} is not a multiple of pad_seq_to_mult {mult}")
    valid, test = _ratio(cfg, "valid_ratio", 0.01), _ratio(cfg, "test_ratio", 0.01)
    if valid + test >= 1:
        raise DataPrepError(f"valid_ratio + test_ratio = {valid + test} leaves nothing to train on")
    seed = cfg.get("seed", 1234)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DataPrepError(f"seed must be an integer >= 0, not {seed!r}")
    return Settings(
        **common_values(cfg, datasets, 128),
        chat_template=str_value(cfg, "chat_template", "nemotron3") or "nemotron3",
        pack_size=pack_size,
        pad_seq_to_mult=mult,
        truncate=bool_value(cfg, "truncate", True),
        valid_ratio=valid,
        test_ratio=test,
        seed=seed,
        row_group_size=int_value(cfg, "row_group_size", None, 1, allow_none=True),
    )
