"""Secure aggregation's cost and accuracy: SecAgg vs SecAgg+ vs the plain mean.

Part 1, one round of n = 10, 100, 1000 clients on updates of d = 10^4 and 10^6 weights at 16 bits:
bytes each client sends and receives, rounds of client -> server messages, and seconds per round
with every client and the server run one after another in this process (what a simulation pays;
a deployment runs the clients in parallel). Cells whose predicted time exceeds ``--budget``
seconds are not run: their seconds are predicted from unit costs measured in the same run (two
X25519 agreements + HKDF + AES-GCM per edge, AES-CTR mask words, quantization words, Shamir
splits), scaled by the median measured / predicted ratio of the cells that ran (the load of a
shared machine moves during a run), and the table marks them ``est.``; every secure cell prints the
unscaled prediction beside its figure, so the model's error is shown. Bytes are exact in every cell (the same arithmetic
as :func:`tensorfleet.federated.secure.traffic`, checked against it on the cells that run).

Part 2, accuracy: 100 clients of scikit-learn's digits (IID), 10 a round, the digits CNN, FedAvg
with 5 local epochs of batch 10, ``--rounds`` rounds (50) with the plain mean, ``secagg`` and
``secagg+`` at 16 bits (clip 1.0), same seed; central test accuracy at the end, and how far the
final weights are from the plain mean's. Then at each ``--noise-multiplier`` z (L2 clip ``--dp-clip``,
1.0): ``dp_fixed`` (the central Gaussian on the plain sum), SecAgg with the same Gaussian added to the
unmasked sum (``dp="central"``) and SecAgg with each client's Skellam noise before masking
(``dp="distributed"``), each with its epsilon after the last round at delta 1e-5 (central: accounted
as ``dp_fixed``, sampling 10 of 100 credited; distributed: the Skellam bound at the fewest
survivors, no sampling credit).

Part 3, the variants (``--variants``): each kind semi-honest (the cells above), with distributed DP
(each client's Skellam noise before masking, noise multiplier 1 at clip 1), in the malicious-server
variant (signed keys, a consistency round) and with both, for n = 10 and 100 at d = 10^4: bytes,
message rounds, seconds per round (median of ``--repeats`` runs, the variants of one cell run one
after another so that their ratio to the semi-honest round is taken under the same load), and the
epsilon of one distributed-DP round at delta 1e-5 (its fewest survivors' noise). ``--variants-clients``
(10 100) and ``--variants-kinds`` pick the cells; a kind whose semi-honest round at n >= 1000 is
predicted above ``--budget`` seconds is not run and its prediction is printed (SecAgg at n = 1000:
about 20 minutes a round here, so ``--variants-clients 1000 --variants-kinds secagg+``).

Run with ``python bench/secure_aggregation.py [--budget 60] [--rounds 50] [--skip-accuracy]
[--skip-cost] [--variants] [--repeats 3] [--variants-clients N ...] [--variants-kinds K ...] [--variants-names V ...]
[--noise-multiplier Z ...] [--dp-clip C] [--only LABEL] [--seeds 1]``.
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import tensorfleet  # noqa: E402,F401  (before TensorFlow: tf.keras is tf_keras)
from tensorfleet.federated.secure import SecureAggregator, keys, shamir  # noqa: E402
from tensorfleet.federated.secure.graph import default_degree  # noqa: E402

BITS = 16
ID, KEYS, SHARE_CT, FIELD_SHARE = 4, 2 * 32 + 4, 2 * shamir.WORDS * 4 + 16 + 8, math.ceil(shamir.WORDS * 21 / 8)


def degree(kind: str, n: int) -> int:
    return n - 1 if kind == "secagg" else min(n - 1, default_degree(n))


def traffic(kind: str, n: int, d: int) -> tuple[float, float]:
    """Bytes up and down per client of a round with no dropouts (traffic()'s arithmetic)."""
    if kind == "mean":
        return 4.0 * d, 4.0 * d
    k = degree(kind, n)
    vector = math.ceil((d + 3) * BITS / 8) + ID
    up = KEYS + k * SHARE_CT + vector + ID + (k + 1) * (FIELD_SHARE + ID)
    down = k * (2 * 32 + ID) + k * SHARE_CT + ID * n
    return float(up), float(down)


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def unit_costs() -> dict[str, float]:
    """Seconds of one edge's cryptography, one mask word, one quantized word, one Shamir holder-coefficient."""
    a, b = keys.KeyPair.generate(), keys.KeyPair.generate()

    def edge() -> None:  # a client's work per neighbour: the share channel (both ways), the mask key
        for purpose in ("share", "mask"):
            key = keys.derive(a.agree(b.public), purpose, 0, 32)
        keys.decrypt(key, b"h", keys.encrypt(key, b"h", bytes(128)))
        keys.decrypt(key, b"h", keys.encrypt(key, b"h", bytes(128)))

    words = 1_000_000
    total = np.zeros(words, np.uint32)

    def mask() -> None:
        nonlocal total
        total += keys.expand_mask(bytes(16), words, BITS)

    from tensorfleet.federated.secure import Quantizer

    quantizer, rng, update = Quantizer(clip=1.0, bits=BITS, clients=10), np.random.default_rng(0), np.zeros(words)
    xs = list(range(1, 502))
    return {"edge": _median_seconds(edge, 200) / 1, "mask_word": _median_seconds(mask, 5) / words,
            "quantize_word": _median_seconds(lambda: quantizer.quantize(update, rng), 3) / words,
            "shamir": _median_seconds(lambda: shamir.split([bytes(32)] * 2, xs, threshold=251), 5) / (501 * 251)}


def predict(kind: str, n: int, d: int, unit: dict[str, float]) -> float:
    """Predicted seconds of a round run sequentially: n clients, then the server."""
    k = degree(kind, n)
    holders = k + 1
    client = (k * unit["edge"] + (k + 1) * d * unit["mask_word"] + d * unit["quantize_word"]
              + holders * (holders // 2 + 1) * unit["shamir"])
    return n * client + n * d * unit["mask_word"]  # the server removes every self mask


def measure(kind: str, n: int, d: int) -> tuple[float, tuple[float, float]]:
    rng = np.random.default_rng(n + d)
    if kind == "mean":
        update = rng.normal(0, 0.1, d).astype(np.float32)

        def mean() -> None:
            total = np.zeros(d, np.float32)
            for _ in range(n):
                total += update
            total /= n

        return _median_seconds(mean, 3), traffic(kind, n, d)
    updates = list(rng.normal(0, 0.1, (n, d)).astype(np.float32))
    aggregator = SecureAggregator(kind=kind, bits=BITS, clip=1.0)
    start = time.perf_counter()
    result = aggregator.aggregate(updates, round_num=0)
    seconds = time.perf_counter() - start
    return seconds, (result.traffic.upload, result.traffic.download)


def cost_table(budget: float) -> None:
    unit = unit_costs()
    print("unit costs: " + ", ".join(f"{k} {v * 1e6:.3f} us" for k, v in unit.items()))
    rows = []
    for d in (10_000, 1_000_000):
        for n in (10, 100, 1000):
            for kind in ("mean", "secagg", "secagg+"):
                up, down = traffic(kind, n, d)
                predicted = 0.0 if kind == "mean" else predict(kind, n, d, unit)
                seconds = None
                if kind == "mean" or predicted <= budget:
                    seconds, measured_bytes = measure(kind, n, d)
                    if kind != "mean":
                        assert measured_bytes == (up, down), (measured_bytes, (up, down))
                rows.append((n, d, kind, up, down, predicted, seconds))
    # The unit costs are timed in a moment; the machine's load moves under a long run. The cells that ran
    # say by how much: their median measured / predicted scales the estimates of the cells that did not.
    ratios = [sec / pred for _, _, kind, _, _, pred, sec in rows if kind != "mean" and sec is not None and pred > 0]
    scale = float(np.median(ratios)) if ratios else 1.0
    print(f"measured / predicted on the cells that ran: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {scale:.2f} scales the estimates")
    print("\n| n | d | aggregator | up bytes/client | down bytes/client | x plain 16-bit | x float32 | "
          "message rounds | s/round | predicted s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, d, kind, up, down, predicted, seconds in rows:
        shown = f"{seconds:.3f}" if seconds is not None else f"est. {predicted * scale:,.0f}"
        plain16 = math.ceil(d * 16 / 8) + ID
        print(f"| {n} | {d:.0e} | {kind} | {up:,.0f} | {down:,.0f} | {up / plain16:.3f} | {up / (4 * d):.3f} | "
              f"{1 if kind == 'mean' else 4} | {shown} | {'' if kind == 'mean' else f'{predicted:.2f}'} |")


def accuracy_rows(noise_multipliers: list[float], dp_clip: float) -> list[tuple[str, str | None, dict | None]]:
    """``(label, aggregator, options)`` of the accuracy table: the plain mean, both secure kinds, then at each
    noise multiplier ``dp_fixed`` (central Gaussian, no secure aggregation), SecAgg with the same noise added
    to the unmasked sum (central) and SecAgg with each client's Skellam noise before masking (distributed)."""
    rows: list[tuple[str, str | None, dict | None]] = [("mean", None, None), ("secagg", "secagg", {"bits": BITS}),
                                                       ("secagg+", "secagg+", {"bits": BITS})]
    for z in noise_multipliers:
        dp = {"noise_multiplier": z, "dp_clip": dp_clip}
        rows += [(f"dp_fixed z={z:g}", "dp_fixed", {"noise_multiplier": z, "clip": dp_clip}),
                 (f"secagg, central DP after unmasking z={z:g}", "secagg", {"bits": BITS, **dp, "dp": "central"}),
                 (f"secagg, distributed DP z={z:g}", "secagg", {"bits": BITS, **dp, "dp": "distributed"})]
    return rows


def _train(clients: object, split: object, rounds: int, name: str | None, options: dict | None,
           seed: int) -> tuple[float, float | None, float, list[np.ndarray], float]:
    """One run of the accuracy table: ``(test accuracy, epsilon, saturated values, final weights, wall s)``."""
    import tensorfleet as tfl

    sim = tfl.federated.Simulation(
        lambda: tfl.models.build("digits_cnn"), clients, "fedavg", rounds=rounds, clients_per_round=10, seed=seed,
        batch_size=10, local_epochs=5, test_data=(split.x_test, split.y_test), eval_every=rounds,
        progress=False, backend="compiled", aggregator=name, aggregator_options=options, dp_delta=1e-5)
    start = time.perf_counter()
    records = sim.run().as_dict()["rounds"]
    wall = time.perf_counter() - start
    # central DP's epsilon is the simulation's (sampling 10 of 100 credited); distributed DP's the part's own
    eps = records[-1].get("epsilon", records[-1].get("aggregator_epsilon"))
    saturated = sum(r.get("aggregator_saturated", 0) for r in records)
    return records[-1]["test_accuracy"], eps, saturated, sim.final_weights(), wall


def accuracy(rounds: int, noise_multipliers: list[float], dp_clip: float = 1.0, only: str | None = None,
             seeds: int = 1) -> None:
    import tensorfleet as tfl

    split = tfl.models.datasets.load_digits()
    clients = tfl.federated.partition(split.x_train, split.y_train, num_clients=100, scheme="iid", seed=0)
    rows = [row for row in accuracy_rows(noise_multipliers, dp_clip)
            if only is None or row[1] is None or only in row[0]]
    print(f"\n| aggregator | test accuracy after {rounds} rounds | points from the mean | epsilon after {rounds} "
          f"rounds (delta 1e-5) | saturated values (all rounds) | largest weight difference from the mean's | wall s |")
    print("|---|---|---|---|---|---|---|")
    found: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for seed in range(seeds):
        reference: dict[str, object] = {}
        for label, name, options in rows:
            accuracy, eps, saturated, weights, wall = _train(clients, split, rounds, name, options, seed)
            found[label].append(accuracy)
            reference.setdefault("accuracy", accuracy)
            reference.setdefault("weights", weights)
            gap = max(float(np.abs(a - b).max()) for a, b in zip(weights, reference["weights"]))
            shown = "" if eps is None or not math.isfinite(eps) else f"{eps:,.1f}"
            print(f"| {label}{f' (seed {seed})' if seeds > 1 else ''} | {accuracy:.4f} | "
                  f"{100 * (accuracy - reference['accuracy']):+.2f} | {shown} | {saturated:.0f} | {gap:.2e} | "
                  f"{wall:.1f} |", flush=True)
    if seeds > 1:  # each seed samples, trains and draws noise anew; a row's difference is paired with its seed's mean
        print(f"\n| aggregator | mean test accuracy over seeds 0-{seeds - 1} | min - max | points from the mean, "
              f"mean over seeds | min - max |")
        print("|---|---|---|---|---|")
        base = np.asarray(found[rows[0][0]])
        for label, values in found.items():
            values, points = np.asarray(values), 100 * (np.asarray(values) - base)
            print(f"| {label} | {values.mean():.4f} | {values.min():.4f} - {values.max():.4f} | {points.mean():+.2f} | "
                  f"{points.min():+.2f} - {points.max():+.2f} |")


VARIANTS = {"semi-honest": {}, "distributed DP": {"dp": "distributed", "noise_multiplier": 1.0},
            "malicious": {"malicious": True}, "both": {"dp": "distributed", "noise_multiplier": 1.0, "malicious": True}}


def variants_table(repeats: int, clients: list[int], kinds: list[str], budget: float, d: int = 10_000,
                   names: list[str] | None = None) -> None:
    """Each variant (of ``names``, with the semi-honest round they are compared with) of each kind at each n;
    a kind whose semi-honest round is predicted above ``budget`` seconds is not run, its predicted seconds
    printed instead (unit costs measured now, unscaled)."""
    chosen = {k: v for k, v in VARIANTS.items() if names is None or k in names or k == "semi-honest"}
    unit = unit_costs() if any(n >= 1000 for n in clients) else None
    print("\n| n | d | aggregator | variant | up bytes/client | down bytes/client | message rounds | s/round | "
          "x semi-honest s | epsilon of 1 round |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios, skipped = [], []
    for n in clients:
        updates = list(np.random.default_rng(n).normal(0, 0.1, (n, d)).astype(np.float32))
        for kind in kinds:
            predicted = predict(kind, n, d, unit) if unit is not None else 0.0
            if predicted > budget:
                skipped.append((n, kind, predicted))
                print(f"| {n} | {d:.0e} | {kind} | semi-honest | {traffic(kind, n, d)[0]:,.0f} | "
                      f"{traffic(kind, n, d)[1]:,.0f} | 4 | not run: predicted {predicted:,.0f} s unscaled | | |",
                      flush=True)
                continue
            aggregators = {name: SecureAggregator(kind=kind, bits=BITS, clip=1.0, **options)
                           for name, options in chosen.items()}
            times: dict[str, list[float]] = {name: [] for name in chosen}
            results = {}
            for _ in range(repeats):  # alternate: each repeat runs every variant once
                for name, aggregator in aggregators.items():
                    start = time.perf_counter()
                    results[name] = aggregator.aggregate(updates, round_num=0)
                    times[name].append(time.perf_counter() - start)
            base = float(np.median(times["semi-honest"]))
            if predicted > 0:
                ratios.append(base / predicted)
            for name, aggregator in aggregators.items():
                traffic_, seconds = results[name].traffic, float(np.median(times[name]))
                eps = (f"{aggregator.epsilon(clients_per_round=n, num_clients=n, rounds=1, size=d):.2f}"
                       if aggregator.dp.value == "distributed" else "")
                print(f"| {n} | {d:.0e} | {kind} | {name} | {traffic_.upload:,.0f} | {traffic_.download:,.0f} | "
                      f"{traffic_.message_rounds} | {seconds:.3f} | {seconds / base:.2f} | {eps} |", flush=True)
    if unit is not None:
        print("unit costs: " + ", ".join(f"{k} {v * 1e6:.3f} us" for k, v in unit.items()))
    for n, kind, predicted in skipped:
        scale = f"; x {np.median(ratios):.2f}, the measured / predicted of the semi-honest cells run here: " \
                f"{predicted * np.median(ratios):,.0f} s" if ratios else ""
        print(f"{kind} at n = {n}, d = {d:.0e} not run: its semi-honest round is predicted at {predicted:,.0f} s "
              f"unscaled{scale}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="run a cell only if predicted below (s)")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--variants", action="store_true", help="also the distributed-DP and malicious variants")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant cell (median)")
    parser.add_argument("--variants-clients", type=int, nargs="+", default=[10, 100], help="n of the variants")
    parser.add_argument("--variants-kinds", nargs="+", default=["secagg", "secagg+"], help="kinds of the variants")
    parser.add_argument("--variants-names", nargs="+", default=None, choices=list(VARIANTS),
                        help="the variants run beside the semi-honest round (default: all)")
    parser.add_argument("--noise-multiplier", type=float, nargs="*", default=[1.0],
                        help="the accuracy table's DP rows at each (none: no DP rows)")
    parser.add_argument("--dp-clip", type=float, default=1.0, help="the DP rows' L2 clip")
    parser.add_argument("--only", default=None, help="the accuracy table's rows whose label holds this (and the mean)")
    parser.add_argument("--seeds", type=int, default=1, help="the accuracy table at seeds 0 to N - 1, summarized")
    args = parser.parse_args()
    if args.variants:
        variants_table(args.repeats, args.variants_clients, args.variants_kinds, args.budget,
                       names=args.variants_names)
    if not args.skip_cost:
        cost_table(args.budget)
    if not args.skip_accuracy:
        accuracy(args.rounds, args.noise_multiplier, args.dp_clip, args.only, args.seeds)


if __name__ == "__main__":
    main()
