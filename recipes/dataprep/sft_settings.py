"""The settings of `ultra3 data prep sft`: its config, read as the launcher compiled and checked it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DataPrepError
from .settings import Common, Dataset, dataset_entries, fields, run_given

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


def parse_settings(cfg: dict) -> Settings:
    if not isinstance(cfg, dict):
        raise DataPrepError("the config is not a mapping")
    datasets = [Dataset(*d) for d in dataset_entries(cfg, "messages_field", "messages",
                                                         "the conversation sets to pack ({name, path, weight})")]
    return Settings(**fields(cfg, Settings, datasets=datasets, **run_given(cfg)))
