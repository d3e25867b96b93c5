"""A federated-averaging experiment on scikit-learn's digits, in script form.

100 clients with label skew (Dirichlet 0.3), FedAvg with 10 clients per round, central test
accuracy every 5 rounds, federated evaluation on 10 held-out clients, a checkpoint every 5 rounds
(run it again with the same --out and it resumes), metrics, plots and a partition picture in
--out. Rounds run on the default backend, ``auto`` (the compiled backend for this model, which
needs no tensorflow-federated; ``--backend tff`` runs them on TFF's runtime, on the tff track). The
same run from the shell:

    tensorfleet federated run --model digits_cnn --clients 100 --partition dirichlet:0.3 \\
        --algorithm fedavg --rounds 30 --clients-per-round 10 --out runs/federated_example

Run with ``python examples/federated_simulation.py [--rounds 30] [--out runs/federated_example]``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--out", default="runs/federated_example")
    parser.add_argument("--backend", default="auto", choices=["auto", "compiled", "tff"])
    args = parser.parse_args()

    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits()
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=100, scheme="dirichlet", alpha=0.3,
                                      seed=0)
    summary = clients.summary()
    print(summary)
    summary.plot(os.path.join(args.out, "partition.png"))

    sim = tfl.federated.Simulation(
        # Federated simulations run Keras 2 (tf_keras) models for now: see docs/keras.md.
        lambda: tfl.models.build("digits_cnn", keras="tf_keras"), clients, args.algorithm,
        rounds=args.rounds, clients_per_round=10, seed=0,
        test_data=(split.x_test, split.y_test), eval_clients=10, eval_every=5,
        out_dir=args.out, checkpoint_every=5, backend=args.backend)
    history = sim.run()
    print(f"final central test accuracy: {history.final('test_accuracy'):.3f} after {history.rounds[-1]['round']} rounds "
          f"(on the {history.config['backend']} backend)")
    print(f"first round at 80% test accuracy: {history.rounds_to('test_accuracy', 0.8)}")
    print(f"metrics, plots and checkpoint in {args.out}")


if __name__ == "__main__":
    main()
