"""``secagg`` and ``secagg+`` as registered aggregators of the compiled backend.

Each is a host part (:class:`~tensorfleet.federated.aggregators.parts.AggregatorPart`): the clients
train in the compiled round, then every participant's update goes through one round of the
protocol (:class:`~tensorfleet.federated.secure.protocol.SecureAggregator`) and the server
optimizer applies the unmasked, dequantized mean. ``dropout_after_upload`` simulates clients that
stop after their masked vector arrived (dropouts and stragglers before upload are the simulation's
own, ``SimulationConfig.dropout`` and ``straggler_deadline``: they never reach the protocol). ``dp="distributed"`` has
each client add Skellam noise before masking; each round's record then holds this part's own ``aggregator_epsilon``
instead of ``epsilon`` (the Skellam bound at the fewest survivors, no sampling amplification, at option ``delta``: a
simulation's ``dp_delta``, else ``1e-5``: :mod:`~tensorfleet.federated.secure.skellam`). ``malicious=True`` runs the
malicious-server variant (signed keys, consistency round). When the survivors cannot unmask the sum the round raises
:class:`~tensorfleet.federated.aggregators.parts.AggregationError` and is not applied.

The ``tff`` backend has no form of them: TFF's ``SecureSumFactory`` is a plain sum in simulation
(its secure intrinsics run as their insecure equivalents), so it would only look secure.

Example:
    >>> from tensorfleet.federated.aggregators import AGGREGATORS, catalogue
    >>> sorted(AGGREGATORS.get("secagg+").defaults)
    ['bits', 'clip', 'degree', 'delta', 'dp', 'dp_clip', 'dropout_after_upload', 'malicious', 'noise_multiplier',
    'threshold']
    >>> [row["backends"] for row in catalogue() if row["name"].startswith("secagg")]
    [['compiled'], ['compiled']]
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from tensorfleet.federated.aggregators import AGGREGATORS
from tensorfleet.federated.aggregators.parts import Aggregate, AggregationError, Aggregator, AggregatorPart
from tensorfleet.federated.secure.messages import COUNTERS, SecureAggregationError
from tensorfleet.federated.secure.protocol import Dropouts, SecureAggregation, SecureAggregator, SecureDp
from tensorfleet.validation import integer, number

__all__ = ["SecurePart", "secure_upload_bytes"]

DEFAULTS = {"bits": 16, "clip": 1.0, "threshold": 0.5, "degree": 0, "noise_multiplier": 0.0, "dp_clip": 1.0,
            "dp": "central", "malicious": False, "dropout_after_upload": 0.0, "delta": None}
DISTRIBUTED_DELTA = 1e-5
_KEYS_BYTES = 2 * 32 + 4


class SecurePart(AggregatorPart):
    """The compiled round's secure aggregation of its participants' updates (see the module)."""

    host = True
    rows = True

    def __init__(self, aggregator: SecureAggregator, dropout_after_upload: float, delta: float = DISTRIBUTED_DELTA,
                 clients_per_round: int = 2) -> None:
        self.aggregator = aggregator
        self.clients_per_round = clients_per_round
        self.dropout_after_upload = dropout_after_upload
        self.delta = delta

    def check_size(self, size: int) -> None:
        """The bits checked against the model's update (distributed DP's noise margin widens with the
        values it covers; the configuration's check could only assume one)."""
        self.aggregator.quantizer(self.clients_per_round, size)

    def client(self, update: Any, weight: Any, state: dict[str, Any], ctx: Any) -> tuple[Any, Any]:
        return update, self.no_aux(update)  # the weight is applied inside the protocol

    def aggregate(self, state: dict[str, Any], updates: Any, ctx: Any) -> Aggregate:
        count = int(updates.participants)
        gone = ctx.rng(1).choice(count, int(round(self.dropout_after_upload * count)), replace=False)
        try:
            result = self.aggregator.aggregate(list(np.asarray(updates.values)[:count]), int(ctx.round_num),
                                               weights=np.asarray(updates.weights, np.float64)[:count],
                                               dropouts=Dropouts(after_upload=gone.tolist()), rng=ctx.rng(2))
        except SecureAggregationError as error:
            raise AggregationError(str(error)) from error
        except ValueError as error:  # fewer than 2 participants
            raise AggregationError(f"Round {int(ctx.round_num)}: {error}") from error
        metrics = {"saturated": result.saturated_values, "saturated_clients": result.saturated_clients,
                   "dropped_after_upload": len(gone), "survivors": result.clients,
                   "upload_bytes": result.traffic.upload}
        if self.aggregator.dp is SecureDp.DISTRIBUTED:
            metrics["epsilon"] = self.aggregator.epsilon(clients_per_round=count, num_clients=count,
                                                         rounds=int(ctx.round_num), delta=self.delta,
                                                         size=int(np.asarray(updates.values).shape[1]))
        return Aggregate(result.mean, state, metrics)


def _part(kind: SecureAggregation, *, clients_per_round: int, seed: int, bits: int, clip: float, threshold: float,
          degree: int, noise_multiplier: float, dp_clip: float, dp: str, malicious: bool,
          dropout_after_upload: float, delta: float | None = None) -> SecurePart:
    integer("degree", degree, minimum=0)
    if isinstance(malicious, str):  # from the command line's NAME:key=value spec
        malicious = {"true": True, "false": False}.get(malicious.strip().lower(), malicious)
    aggregator = SecureAggregator(kind=kind, clip=clip, bits=bits, threshold=threshold, degree=degree or None,
                                  noise_multiplier=noise_multiplier, dp_clip=dp_clip, dp=dp, malicious=malicious,
                                  seed=seed)
    # bits enough for the sum (and for distributed DP's noise on one value: the model's size is checked
    # when the simulation starts, SecurePart.check_size)
    aggregator.quantizer(integer("clients_per_round", clients_per_round, minimum=2))
    return SecurePart(aggregator, number("dropout_after_upload", dropout_after_upload, minimum=0, below=1),
                      DISTRIBUTED_DELTA if delta is None else number("delta", delta, above=0, below=1),
                      clients_per_round)


def _central(options: dict[str, Any]) -> bool:
    """Whether the simulation accounts the noise as central (distributed DP reports its own epsilon)."""
    return str(options["dp"]).strip().lower() != SecureDp.DISTRIBUTED.value


def secure_upload_bytes(sizes: list[int], options: dict[str, Any]) -> int:
    """Bytes of a client's public keys and masked vector (``bits`` a value); the encrypted shares,
    152 bytes for each neighbour, and the unmasking shares come on top (bench/secure_aggregation.py)."""
    bits = int({**DEFAULTS, **options}["bits"])
    return _KEYS_BYTES + math.ceil((sum(sizes) + COUNTERS) * bits / 8) + 4


for _kind, _paper, _text, _aliases in (
        (SecureAggregation.SECAGG, "Bonawitz et al., CCS 2017", "Secure aggregation, every pair masks "
         "(Bonawitz et al. 2017): the server sees only masked vectors and their sum. Compiled backend only: "
         "TFF's SecureSumFactory is a plain sum in simulation.", ()),
        (SecureAggregation.SECAGG_PLUS, "Bell et al., CCS 2020", "Secure aggregation over a random graph of "
         "degree O(log n) (SecAgg+, Bell et al. 2020). Compiled backend only: TFF's SecureSumFactory is a plain "
         "sum in simulation.", ("secagg_plus",))):
    AGGREGATORS.register(_kind.value, Aggregator(compiled=functools.partial(_part, _kind), tff=None,
                                                 defaults=dict(DEFAULTS), dp=_central,
                                                 upload_bytes=secure_upload_bytes,
                                                 paper=_paper), description=_text, aliases=_aliases)
