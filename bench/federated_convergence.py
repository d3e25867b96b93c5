"""Rounds to a target central test accuracy: FedAvg vs FedSGD, IID vs shards:2 (McMahan et al. 2017).

100 clients of scikit-learn's digits, 10 per round, the digits MLP; FedAvg runs 5 local epochs of
batch 10 (the paper's E=5, B=10), FedSGD one full-batch gradient per client per round. Each run
stops at the target or at its round cap. Prints a Markdown table for bench/RESULTS.md.

It drives TFF's own process, so it runs on the tff track (``.venv-tff/bin/python``).

Run with ``python bench/federated_convergence.py [--target 0.9]``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def rounds_to_target(algorithm: str, scheme: str, *, target: float, cap: int) -> tuple[int | None, float, float, float]:
    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits(flat=True)
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=100, scheme=scheme, seed=0)
    sim = tfl.federated.Simulation(
        lambda: tfl.models.build("digits_mlp"), clients, algorithm, rounds=cap, clients_per_round=10, seed=0,
        batch_size=10, local_epochs=5, test_data=(split.x_test, split.y_test), eval_every=1, progress=False,
        backend="tff")  # it drives TFF's own process round by round
    start = time.perf_counter()
    process = sim.build()
    state = process.initialize()
    reached, best, last = None, 0.0, 0.0
    for round_num in range(1, cap + 1):
        who = sim.sample(round_num)
        state = process.next(state,
                             [sim.sampler.client_dataset(clients, c, round_num) for c in who["participants"]]).state
        last = sim.evaluate_central(state)["test_accuracy"]
        best = max(best, last)
        if last >= target:
            reached = round_num
            break
    sim.runtime.stop()
    return reached, last, best, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--cap-fedavg", type=int, default=150)
    parser.add_argument("--cap-fedsgd", type=int, default=400)
    args = parser.parse_args()
    rows = []
    for scheme in ("iid", "shards:2"):
        for algorithm in ("fedavg", "fedsgd"):
            cap = args.cap_fedavg if algorithm == "fedavg" else args.cap_fedsgd
            reached, last, best, seconds = rounds_to_target(algorithm, scheme, target=args.target, cap=cap)
            rows.append((algorithm, scheme, reached, cap, last, best, seconds))
            print(f"{algorithm} {scheme}: rounds to {args.target:.0%}: {reached or f'> {cap}'} "
                  f"(last {last:.3f}, best {best:.3f}, {seconds:.0f} s)", flush=True)
    print(f"\n| algorithm | partition | rounds to {args.target:.0%} test accuracy | accuracy at stop | best | wall s |")
    print("|---|---|---|---|---|---|")
    for algorithm, scheme, reached, cap, last, best, seconds in rows:
        print(f"| {algorithm} | {scheme} | {reached if reached else f'not within {cap}'} | {last:.3f} | {best:.3f} | "
              f"{seconds:.0f} |")


if __name__ == "__main__":
    main()
