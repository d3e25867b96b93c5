"""Launch a 2-worker job from Python, kill a worker mid-training, watch it resume.

The notebook form of ``tensorfleet launch``: the digits CNN trains with multi-worker
mirrored over 2 local processes; worker 1 is SIGKILLed during epoch 3; the launcher stops
the survivor, restarts both, and the job resumes from the epoch-2 backup. Prints the
launcher's events and where the job resumed.

    python examples/launch_fault_tolerant.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tensorfleet import testing
from tensorfleet.cluster import Recovery, TaskOutput, Timeouts, launch, resumed_epoch

SCRIPT = Path(__file__).with_name("train_digits_multiworker.py")


def main() -> int:
    # The crash is staged with tensorfleet's own test hook (tensorfleet.testing, not the user API): the launcher
    # SIGKILLs worker 1 when it prints that line, as a machine or an out-of-memory kill would.
    crash = testing.Fault("worker:1", r"^tensorfleet: epoch 3 step 2$")
    with tempfile.TemporaryDirectory() as scratch, testing.faults(crash):
        result = launch(
            SCRIPT, ["--epochs", "6", "--examples-per-epoch", "256", "--log-steps"],
            workers=2, timeouts=Timeouts(timeout=300),
            recovery=Recovery(max_restarts=2, backoff=1.0, backup_dir=Path(scratch) / "backup"),
            output=TaskOutput(log=lambda line: print(line) if "step" not in line else None),
        )
    print(f"\nexit status {result.returncode}, {result.restarts} restart(s), {result.duration:.1f} s")
    print(f"resumed at epoch {resumed_epoch(result.output('worker:0', attempt=1))}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
