"""Distributed tuning: trials per hour with 1 and 2 Keras Tuner workers, one core per trial.

Runs the search of examples/tune_digits.py (a small CNN on digits; filters, units, dropout and
learning rate searched at random with a fixed seed, so every run trains the same trials) through
:func:`tensorfleet.tuning.distributed.search` with ``--pin-cores``: worker i on core i. 1 worker
and 2 workers alternate ``--rounds`` times in one run (timings on a shared 2-core machine swing
widely, so the median counts). Trials per hour are counted from the chief's record of when each
trial began and ended, from the first begin to the last end (the processes' start-up is left out
and reported apart as the wall time of the whole search).

Example:
    python bench/tuning.py --rounds 3 --trials 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "tune_digits.py"


def _trials_per_hour(out: Path) -> float:
    times = json.loads((out / "times.json").read_text()).values()
    span = max(t["end"] for t in times) - min(t["start"] for t in times)
    return len(times) * 3600.0 / span


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    from tensorfleet.tuning.distributed import Supervision, TrialOptions, search

    load_before = os.getloadavg()[0]
    rates: dict[int, list[float]] = {1: [], 2: []}
    walls: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as scratch:
        runs = [(r, w) for r in range(args.rounds) for w in ((1, 2) if r % 2 == 0 else (2, 1))]
        for i, (_, workers) in enumerate(tqdm(runs, desc="searches", file=sys.stderr)):
            out = Path(scratch) / f"s{i}"
            result = search(SCRIPT, out=out, workers=workers, max_trials=args.trials, epochs=args.epochs,
                            trial=TrialOptions(pin_cores=True), supervision=Supervision(timeout=1800),
                            log=lambda line: None)
            if result.completed != args.trials:
                raise RuntimeError(f"a search completed {result.completed} of {args.trials} trials")
            rates[workers].append(_trials_per_hour(out))
            walls[workers].append(result.seconds)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"tuning: {args.trials} trials of {SCRIPT.name} ({args.epochs} epochs each), random search, "
          f"one core per trial, {os.cpu_count()} cores, {args.rounds} rounds alternated, medians")
    print(f"{'workers':>8} {'trials/hour':>12} {'search wall (s)':>16}   all trials/hour")
    for workers in (1, 2):
        print(f"{workers:>8} {statistics.median(rates[workers]):>12.0f} {statistics.median(walls[workers]):>16.1f}"
              f"   {', '.join(f'{r:.0f}' for r in rates[workers])}")
    print(f"ratio 2 workers / 1 worker: {two / one:.2f}x (target >= 1.6x on 2 cores)")
    # Other work on the machine takes cores from the workers: the load says how far to trust this.
    print(f"1-minute load average: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
