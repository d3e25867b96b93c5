"""Launcher scaling: the same multi-worker fit at 1 and 2 local workers, and recovery time.

Runs examples/train_digits_multiworker.py through tensorfleet's launcher:

* throughput: 1 worker and 2 workers alternated ``--rounds`` times in one run (timings on a
  shared 2-core machine swing widely, so contenders alternate and the median counts);
  examples/s are measured from the chief's log, from the start of epoch 2 to the end of the
  last epoch (epoch 1 carries tracing and warm-up);
* recovery: a 2-worker run in which worker 1 is SIGKILLed during epoch 3; the time from
  the kill to the restarted job's "resumed from backup" line and to its first completed
  epoch, with a PNG timeline of the run (``--plot``);
* pollers (``--pollers``, instead of the above): 2 workers with ``GRPC_POLL_STRATEGY`` set to
  ``poll`` and to ``epoll1`` (gRPC's default),
  alternated ``--rounds`` times: median examples/s, wall and the tasks' CPU time (user + system,
  from this process's reaped children), and their ratios.

Example:
    python bench/launch_scaling.py --rounds 3
    python bench/launch_scaling.py --pollers --rounds 4
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_digits_multiworker.py"


def _throughput(result, epochs: int, examples_per_epoch: int) -> float:
    start = result.first_time(r"^tensorfleet: epoch 2/\d+ begin", task="worker:0")
    end = result.first_time(rf"^tensorfleet: epoch {epochs}/{epochs} end", task="worker:0")
    if start is None or end is None:
        raise RuntimeError("the run's log lacks the epoch lines this benchmark measures")
    return (epochs - 1) * examples_per_epoch / (end - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--examples-per-epoch", type=int, default=1024)
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--plot", default=str(ROOT / "bench" / "out" / "launch_recovery.png"),
                        help="PNG timeline of the (first) kill-and-resume run")
    parser.add_argument("--pollers", action="store_true",
                        help="compare gRPC's poll and epoll1 pollers at 2 workers instead")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: {args.rounds}")
    if args.pollers:
        _pollers(args)
        return

    from tensorfleet import testing
    from tensorfleet.cluster.launcher import Recovery, TaskOutput, Timeouts, launch
    from tensorfleet.testing import Fault

    common = ["--model", args.model, "--epochs", str(args.epochs),
              "--examples-per-epoch", str(args.examples_per_epoch), "--global-batch-size", "64"]
    rates: dict[int, list[float]] = {1: [], 2: []}
    walls: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as scratch:
        runs = [(r, w) for r in range(args.rounds) for w in ((1, 2) if r % 2 == 0 else (2, 1))]
        for i, (r, workers) in enumerate(tqdm(runs, desc="throughput runs", file=sys.stderr)):
            result = launch(SCRIPT, [*common, "--batch-policy", "keep_global"], workers=workers,
                            recovery=Recovery(backup_dir=Path(scratch) / f"b{i}"), timeouts=Timeouts(timeout=300),
                            output=TaskOutput(log=None))
            rates[workers].append(_throughput(result, args.epochs, args.examples_per_epoch))
            walls[workers].append(result.duration)

        recovery = []
        for i in tqdm(range(max(1, args.rounds // 2)), desc="kill-and-resume runs", file=sys.stderr):
            with testing.faults(Fault("worker:1", r"^tensorfleet: epoch 3 step 2$")):
                result = launch(SCRIPT, [*common, "--log-steps"], workers=2,
                                recovery=Recovery(max_restarts=1, backoff=0.0, backup_dir=Path(scratch) / f"k{i}"),
                                timeouts=Timeouts(timeout=300), output=TaskOutput(log=None))
            kill = next(e.time for e in result.events if e.text.startswith("injecting fault"))
            resumed = result.first_time(r"^tensorfleet: resumed from backup at epoch 3$", task="worker:0", after=kill)
            epoch_done = result.first_time(r"^tensorfleet: epoch 3/\d+ end", task="worker:0", after=kill)
            if resumed is None or epoch_done is None:
                raise RuntimeError("the restarted job did not resume from its backup")
            recovery.append((resumed - kill, epoch_done - kill, result.duration))
            if i == 0 and args.plot:
                result.plot(args.plot,
                            title=f"2 workers, worker 1 SIGKILLed in epoch 3: resumed {resumed - kill:.1f} s "
                                              "after the kill")

    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"launch scaling: {args.model}, {args.epochs} epochs x {args.examples_per_epoch} examples, "
          f"global batch 64, {args.rounds} alternating rounds")
    for workers in (1, 2):
        print(f"  {workers} worker(s): median {statistics.median(rates[workers]):8.1f} examples/s "
              f"(runs: {', '.join(f'{x:.1f}' for x in rates[workers])}); median wall "
              f"{statistics.median(walls[workers]):.1f} s")
    print(f"  ratio 2 workers / 1 worker (median throughput): {two / one:.2f}x")
    for k, (resumed, epoch_done, wall) in enumerate(recovery):
        print(f"  kill -> resumed from backup: {resumed:.1f} s; kill -> resumed epoch finished: {epoch_done:.1f} s "
              f"(run {k}, whole job {wall:.1f} s)")


def _pollers(args: argparse.Namespace) -> None:
    from tensorfleet.cluster.launcher import Recovery, TaskCommand, TaskOutput, Timeouts, launch

    common = ["--model", args.model, "--epochs", str(args.epochs), "--examples-per-epoch",
              str(args.examples_per_epoch), "--global-batch-size", "64", "--batch-policy", "keep_global"]
    order = ("poll", "epoll1")
    rates: dict[str, list[float]] = {p: [] for p in order}
    walls: dict[str, list[float]] = {p: [] for p in order}
    cpus: dict[str, list[float]] = {p: [] for p in order}
    with tempfile.TemporaryDirectory() as scratch:
        runs = [(r, p) for r in range(args.rounds) for p in (order if r % 2 == 0 else order[::-1])]
        for i, (_, poller) in enumerate(tqdm(runs, desc="poller runs", file=sys.stderr)):
            before = _children_cpu()
            result = launch(SCRIPT, common, workers=2, command=TaskCommand(env={"GRPC_POLL_STRATEGY": poller}),
                            recovery=Recovery(backup_dir=Path(scratch) / f"p{i}"), timeouts=Timeouts(timeout=300),
                            output=TaskOutput(log=None))
            if result.returncode != 0:
                raise RuntimeError(f"a run with GRPC_POLL_STRATEGY={poller} failed: {result.error}")
            rates[poller].append(_throughput(result, args.epochs, args.examples_per_epoch))
            walls[poller].append(result.duration)
            cpus[poller].append(_children_cpu() - before)
    print(f"gRPC pollers: {args.model}, 2 workers, {args.epochs} epochs x {args.examples_per_epoch} examples, "
          f"global batch 64, {args.rounds} alternating rounds")
    for poller in order:
        print(f"  {poller:>6}: median {statistics.median(rates[poller]):8.1f} examples/s "
              f"(runs: {', '.join(f'{x:.1f}' for x in rates[poller])}); median wall "
              f"{statistics.median(walls[poller]):.1f} s; median CPU {statistics.median(cpus[poller]):.1f} s "
              f"(runs: {', '.join(f'{x:.1f}' for x in cpus[poller])})")
    print(f"  ratio poll / epoll1 (median throughput): "
          f"{statistics.median(rates['poll']) / statistics.median(rates['epoll1']):.3f}x; "
          f"(median CPU): {statistics.median(cpus['poll']) / statistics.median(cpus['epoll1']):.3f}x")


def _children_cpu() -> float:
    """User + system seconds of this process's reaped children (the launched tasks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
