"""Bad records: counted by kind, with the first few places of each (`file:line` or `file:row=N`), merged from
shards into datasets, and the check that fails a dataset with too many of them (`max_bad_fraction`). Under
`strict` the first one stops the run."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import BadRecordError, DataPrepError

BAD_KINDS = ("invalid_json", "missing_field", "not_a_string", "bad_utf8", "empty_text", "too_long")
MAX_EXAMPLES = 5  # places kept per kind of bad record, per shard and per dataset


@dataclass
class BadRecords:
    """Counts of bad records by kind, with the first MAX_EXAMPLES places of each kind."""

    strict: bool = False
    counts: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)

    def add(self, kind: str, where: str, detail: str) -> None:
        if self.strict:
            raise BadRecordError(f"bad record ({kind}) at {where}: {detail} (strict: true)")
        self.counts[kind] = self.counts.get(kind, 0) + 1
        seen = self.examples.setdefault(kind, [])
        if len(seen) < MAX_EXAMPLES:
            seen.append(f"{where}: {detail}")

    def merge(self, counts: dict, examples: dict) -> None:
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        for kind, places in examples.items():
            seen = self.examples.setdefault(kind, [])
            seen += places[: MAX_EXAMPLES - len(seen)]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def first(self) -> str:
        return next((f"{places[0]} ({kind})" for kind, places in self.examples.items() if places), "")

    def to_json(self) -> dict:
        order = {k: i for i, k in enumerate(BAD_KINDS)}
        kinds = sorted(self.counts, key=lambda k: (order.get(k, len(order)), k))
        return {"counts": {k: self.counts[k] for k in kinds}, "examples": {k: self.examples[k] for k in kinds}}


def check_yield(what: str, records: int, good: int, bad: BadRecords, max_bad: float) -> None:
    """A dataset that gives nothing to train on, or with more bad records than `max_bad` of them, fails the run
    (nothing is published): the count and the first bad record say why."""
    if good and bad.total <= max_bad * records:
        return
    first = f"; first: {bad.first()}" if bad.total else ""
    raise DataPrepError(f"{what}: {bad.total:,} of {records:,} records are bad and {good:,} usable (max_bad_fraction "
                        f"{max_bad:g}){first}; fix the input, or raise max_bad_fraction to accept them")
