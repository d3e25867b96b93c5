"""A federated experiment on scikit-learn's digits, in script form, with a model written in plain ``import keras``.

20 clients with label skew (Dirichlet 0.5), FedProx (mu=1.0) with secure aggregation (SecAgg+: the server
sees only the sum of the 10 clients of each round), central test accuracy every 5 rounds, federated evaluation
on 4 held-out clients, a checkpoint every 5 rounds (run it again with the same --out and it resumes), metrics,
plots and a partition picture in --out. Rounds run on the default backend, ``auto`` (the compiled backend, which
needs no tensorflow-federated). ``--seed`` makes the whole run, the model's initial weights included: the same
seed gives the same final weights.

The script also saves the initial model as ``OUT/model.keras``, so that the same run goes from the shell
(``federated_simulation.yaml`` beside this script holds the settings; ``--set`` style flags override them):

    tensorfleet federated run --config examples/federated_simulation.yaml --model runs/federated_example/model.keras \\
        --out runs/federated_cli

Run with ``python examples/federated_simulation.py [--rounds 30] [--out runs/federated_example] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default="runs/federated_example")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import keras

    import tensorfleet as tfl

    def model_fn() -> keras.Model:
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),  # logits
        ])

    split = tfl.models.load_digits()
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=20, scheme="dirichlet", alpha=0.5,
                                      seed=args.seed)
    summary = clients.summary()
    print(summary)
    summary.plot(os.path.join(args.out, "partition.png"))

    # The initial model, for the shell twin: the seed that makes the run makes these weights too.
    keras.utils.set_random_seed(args.seed)
    model_fn().save(os.path.join(args.out, "model.keras"))

    sim = tfl.federated.Simulation(
        model_fn, clients, "fedprox", algorithm_options={"mu": 1.0}, aggregator="secagg+",
        rounds=args.rounds, clients_per_round=10, seed=args.seed,
        test_data=(split.x_test, split.y_test), eval_clients=4, eval_every=5,
        out_dir=args.out, checkpoint_every=5)
    history = sim.run()
    print(f"final central test accuracy: {history.final('test_accuracy'):.3f} after {history.rounds[-1]['round']} "
          f"rounds (on the {history.config['backend']} backend)")
    print(f"first round at 80% test accuracy: {history.rounds_to('test_accuracy', 0.8)}")
    print(f"metrics, plots and checkpoint in {args.out}")


if __name__ == "__main__":
    main()
