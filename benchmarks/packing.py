"""SFT packing benchmark: our best-fit decreasing (recipes.dataprep.packing) on 1 M long-tailed
(lognormal) sequence lengths, against a naive first-fit on a 20 k subset.

    python benchmarks/packing.py [--n 1000000] [--naive-n 20000] [--repeat 3]

Cases (lengths in tokens; sizes in pad_seq_to_mult units as the data prep packs them):
* pack 4,096 and 8,192: lognormal, median 600 tokens, sigma 1.0 (mean ~990), clipped to the pack;
* pack 294,912 (the Ultra SFT length): median 43,200 tokens (72x), same shape, with pad_seq_to_mult 16
  (CP8/TP2, as configs/data_prep/sft/default.yaml) and with 1 (every token length distinct).
Targets: >= 99.5 % efficiency and <= 1 s per million sequences. Time is the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the runtime package `recipes`

from recipes.dataprep.packing import best_fit_decreasing, efficiency, first_fit_naive  # noqa: E402

CASES = [  # (pack size, median length, pad_seq_to_mult)
    (4096, 600, 1),
    (8192, 600, 1),
    (294912, 43200, 16),
    (294912, 43200, 1),
]


def lengths(n: int, median: int, pack: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), 1.0, n).astype(np.int64), 2, pack)


def timed(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--naive-n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'pack':>7} {'mult':>4} {'algorithm':<22} {'N':>9} {'time s':>8} {'efficiency':>10} {'packs':>8}"
          f" {'seq/pack':>8}  ({os.cpu_count()} CPUs)")
    for pack, median, mult in CASES:
        tokens = lengths(args.n, median, pack)
        sizes = -(-tokens // mult)  # padded to the multiple, in units of it
        cap = pack // mult
        t, p = timed(lambda s=sizes, c=cap: best_fit_decreasing(s, c), args.repeat)
        print(f"{pack:>7} {mult:>4} {'best-fit decreasing':<22} {len(sizes):>9,} {t:>8.3f} "
              f"{efficiency(sizes, p):>10.4%} {p.num_bins:>8,} {len(sizes) / p.num_bins:>8.2f}")
        sub = sizes[: args.naive_n]
        t, p = timed(lambda s=sub, c=cap: first_fit_naive(s, c), 1)
        print(f"{pack:>7} {mult:>4} {'first-fit (naive scan)':<22} {len(sub):>9,} {t:>8.3f} "
              f"{efficiency(sub, p):>10.4%} {p.num_bins:>8,} {len(sub) / p.num_bins:>8.2f}")
        t, p = timed(lambda s=sub, c=cap: best_fit_decreasing(s, c), args.repeat)
        print(f"{pack:>7} {mult:>4} {'best-fit decreasing':<22} {len(sub):>9,} {t:>8.3f} "
              f"{efficiency(sub, p):>10.4%} {p.num_bins:>8,} {len(sub) / p.num_bins:>8.2f}")


if __name__ == "__main__":
    main()
