"""One round of secure aggregation run end to end in one process: clients and a server that talk
only through messages (:func:`run_round`), the bytes each client sends and receives
(:func:`traffic`), and :class:`SecureAggregator`, which turns the clients' float updates into their
mean through that protocol.

Example:
    >>> import numpy as np
    >>> aggregator = SecureAggregator(kind="secagg+", clip=1.0, bits=16)
    >>> updates = [np.full(5, 0.25, np.float32), np.full(5, -0.5, np.float32), np.full(5, 2.0, np.float32)]
    >>> result = aggregator.aggregate(updates, round_num=0, dropouts=Dropouts(after_upload={1}))
    >>> bool(np.abs(result.mean - (0.25 - 0.5 + 1.0) / 3).max() <= aggregator.quantizer(3).step)
    True
    >>> result.clients, result.saturated_clients, result.saturated_values
    (3, 1, 5)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable, Sequence

import numpy as np

from tensorfleet.federated.secure.client import SecAggClient
from tensorfleet.federated.secure.graph import default_degree
from tensorfleet.federated.secure.keys import SIGNATURE_BYTES, Identity
from tensorfleet.federated.secure.messages import RoundSettings, SecureAggregationError, TooFewSurvivorsError
from tensorfleet.federated.secure.quantize import MAX_BITS, Quantizer
from tensorfleet.federated.secure.server import SecAggServer, SecureSum, ServerView
from tensorfleet.federated.secure.shamir import WORDS
from tensorfleet.federated.secure.skellam import SkellamPlan
from tensorfleet.validation import boolean, choice, integer, number

__all__ = ["Dropouts", "SecureAggregation", "SecureAggregator", "SecureDp", "SecureRound", "Traffic", "make_clients",
           "run_round", "traffic"]

MESSAGE_ROUNDS = 4  # client -> server: keys, shares, masked vector, unmasking shares
_FIELD_BITS = 21
_ID_BYTES = 4


class SecureAggregation(str, Enum):
    """Which graph the pairwise masks follow."""

    SECAGG = "secagg"  # every pair (Bonawitz et al. 2017)
    SECAGG_PLUS = "secagg+"  # a random k-regular graph, k = O(log n) (Bell et al. 2020)


class SecureDp(str, Enum):
    """Where DP's noise is added: to the unmasked sum (``central``) or by each client before masking
    (``distributed``, Skellam noise: :mod:`~tensorfleet.federated.secure.skellam`)."""

    CENTRAL = "central"
    DISTRIBUTED = "distributed"


def _ids(values: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in values)


@dataclass(frozen=True)
class Dropouts:
    """Which of a round's clients stop, and when: before advertising keys, after sharing keys but
    before uploading a masked vector, or after uploading it (before sending unmasking shares)."""

    before_keys: frozenset[int] = field(default_factory=frozenset)
    before_upload: frozenset[int] = field(default_factory=frozenset)
    after_upload: frozenset[int] = field(default_factory=frozenset)

    def __init__(self, before_keys: Iterable[int] = (), before_upload: Iterable[int] = (),
                 after_upload: Iterable[int] = ()) -> None:
        object.__setattr__(self, "before_keys", _ids(before_keys))
        object.__setattr__(self, "before_upload", _ids(before_upload))
        object.__setattr__(self, "after_upload", _ids(after_upload))


def make_clients(count: int, settings: RoundSettings, rng: np.random.Generator) -> list[SecAggClient]:
    """``count`` clients of a round; in the malicious-server variant each with an Ed25519 identity
    registered in a PKI that every client holds (set up outside the protocol, as the paper assumes)."""
    if not settings.malicious:
        return [SecAggClient(i, settings, rng) for i in range(count)]
    identities = [Identity.generate() for _ in range(count)]
    pki = {i: identity.public for i, identity in enumerate(identities)}
    return [SecAggClient(i, settings, rng, identity=identities[i], pki=pki) for i in range(count)]


def run_round(updates: Sequence[Any], settings: RoundSettings, *, dropouts: Dropouts = Dropouts(),
              rng: np.random.Generator | None = None, weights: Sequence[float] | None = None,
              clients: Sequence[SecAggClient] | None = None) -> tuple[SecureSum, ServerView]:
    """Run one round: ``updates[i]`` is client ``i``'s float update, ``weights[i]`` its weight (0 to
    1; default 1); ``clients`` the round's clients (default :func:`make_clients`). Returns the
    unmasked sum and everything the server received; raises
    :class:`~tensorfleet.federated.secure.messages.TooFewSurvivorsError` when the sum cannot be unmasked."""
    rng = rng if rng is not None else np.random.default_rng()
    clients = list(clients) if clients is not None else make_clients(len(updates), settings, rng)
    server = SecAggServer(settings)
    active = [c for c in clients if c.client not in dropouts.before_keys]
    plans = server.receive_keys([c.advertise() for c in active])
    by_id = {c.client: c for c in active}
    routed = server.route_shares([share for plan in plans for share in by_id[plan.client].share_keys(plan)])
    uploading = [c for c in active if c.client not in dropouts.before_upload]
    for c in uploading:
        c.receive_shares(routed.get(c.client, []))
    weights = [1.0] * len(updates) if weights is None else weights
    request = server.receive_masked([c.masked_input(updates[c.client], weights[c.client]) for c in uploading])
    answering = [c for c in uploading if c.client not in dropouts.after_upload]
    proof = server.consistency([c.sign_survivors(request) for c in answering]) if settings.malicious else None
    return server.unmask([c.unmask(request, proof) for c in answering]), server.view


@dataclass(frozen=True)
class Traffic:
    """Mean bytes per client of one round (masked vectors packed to ``bits``, shares to 21-bit
    field elements), and the client -> server message rounds."""

    upload: float
    download: float
    message_rounds: int = MESSAGE_ROUNDS

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def traffic(view: ServerView, settings: RoundSettings) -> Traffic:
    """What the clients of ``view``'s round sent and received, per client that advertised keys."""
    clients = max(len(view.keys), 1)
    share_bytes = math.ceil(WORDS * _FIELD_BITS / 8)
    vector_bytes = math.ceil(settings.length * settings.quantizer.bits / 8)
    signed = SIGNATURE_BYTES if view.keys and view.keys[0].signature else 0  # the malicious-server variant
    keys = sum(len(k.cipher_public) + len(k.mask_public) + len(k.signature) + _ID_BYTES for k in view.keys)
    shares = sum(len(s.ciphertext) + 2 * _ID_BYTES for s in view.shares)
    masked = len(view.masked) * (vector_bytes + _ID_BYTES)
    consistency = sum(len(s.signature) + _ID_BYTES for s in view.signatures)
    unmasking = sum(_ID_BYTES + (len(r.self_mask_shares) + len(r.key_shares)) * (share_bytes + _ID_BYTES)
                    for r in view.unmasking)
    degree = len(view.shares) / clients  # neighbours each client sent shares to
    download = (degree * (2 * 32 + signed + _ID_BYTES) + shares / clients + _ID_BYTES * len(view.masked)
                + (consistency if signed else 0))
    return Traffic(upload=(keys + shares + masked + consistency + unmasking) / clients, download=download,
                   message_rounds=MESSAGE_ROUNDS + (1 if signed else 0))


@dataclass(frozen=True)
class SecureRound:
    """One round's result: the mean update, how many clients' updates it averages, and how many of
    them (and how many values in all) the clip saturated."""

    mean: np.ndarray
    clients: int
    saturated_clients: int
    saturated_values: int
    traffic: Traffic

    def as_dict(self) -> dict[str, Any]:
        return {"clients": self.clients, "saturated_clients": self.saturated_clients,
                "saturated_values": self.saturated_values, **self.traffic.as_dict()}

    def describe(self) -> str:
        return (f"secure aggregation of {self.clients} clients: {self.saturated_values} values of "
                f"{self.saturated_clients} clients saturated the clip; {self.traffic.upload:,.0f} bytes up, "
                f"{self.traffic.download:,.0f} down per client in {self.traffic.message_rounds} message rounds")


@dataclass(frozen=True)
class SecureAggregator:
    """The unweighted mean of the clients' updates by SecAgg (``kind="secagg"``) or SecAgg+.

    Args:
        kind: ``"secagg"`` (every pair masks) or ``"secagg+"`` (a random graph of ``degree``).
        clip: each value is clipped to ``[-clip, clip]`` before quantization (saturation is counted).
        bits: sums are taken mod ``2 ** bits`` (what a value costs on the wire).
        threshold: a secret needs more than this share of its holders' shares.
        degree: SecAgg+'s even degree (None: ``2 * ceil(log2 n)``).
        noise_multiplier: DP: each update is L2-clipped to ``dp_clip`` and the sum gets noise of
            stddev ``noise_multiplier * dp_clip`` (0: none), where ``dp`` says.
        dp_clip: the L2 clip of DP.
        dp: ``"central"``: Gaussian noise on the unmasked sum (the server sees the sum without it);
            ``"distributed"``: each of the round's n clients adds Skellam noise of 1/n of the variance
            to its quantized values before masking (the server never sees an un-noised sum).
        malicious: the malicious-server variant: signed keys and a consistency round (Bonawitz et
            al. 2017, section 6; one more message round).
        seed: seeds the graph, the rounding and the noise (with the round number).
    """

    kind: SecureAggregation | str = SecureAggregation.SECAGG
    clip: float = 1.0
    bits: int = 32
    threshold: float = 0.5
    degree: int | None = None
    noise_multiplier: float = 0.0
    dp_clip: float = 1.0
    dp: SecureDp | str = SecureDp.CENTRAL
    malicious: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", choice(SecureAggregation, "kind", self.kind))
        object.__setattr__(self, "dp", choice(SecureDp, "dp", self.dp))
        number("clip", self.clip, above=0)
        integer("bits", self.bits, minimum=2, maximum=MAX_BITS)
        number("threshold", self.threshold, minimum=0, below=1)
        degree = integer("degree", self.degree, minimum=2, optional=True)
        if degree is not None and degree % 2:
            raise ValueError(f"degree must be even (a ring joins each client to degree / 2 on either side). "
                             f"Received: degree={self.degree}")
        number("noise_multiplier", self.noise_multiplier, minimum=0)
        number("dp_clip", self.dp_clip, above=0)
        if self.dp is SecureDp.DISTRIBUTED and self.noise_multiplier == 0:
            raise ValueError("dp='distributed' adds each client's share of the noise: it needs noise_multiplier > 0. "
                             "Received: noise_multiplier=0")
        if boolean("malicious", self.malicious) and self.threshold < 0.5:
            raise ValueError(f"The malicious-server variant needs threshold >= 0.5, so that two disjoint groups of "
                             f"clients cannot each reach it with a different survivor list. Received: "
                             f"threshold={self.threshold}")
        integer("seed", self.seed, minimum=0)

    def quantizer(self, clients: int, size: int = 1) -> Quantizer:
        plan = self.skellam_plan(clients, size)
        return Quantizer(clip=self.clip, bits=self.bits, clients=clients, headroom=plan.margin if plan else 0)

    def min_survivors(self, clients: int) -> int:
        """The fewest of ``clients`` whose sum distributed DP releases (its epsilon counts their noise): SecAgg's
        threshold. A floor on the noise, so of the whole round for SecAgg+ too; SecAgg+'s masks come off by each
        neighbourhood's threshold, which on its ring implies more than ``threshold * clients`` answers whenever
        every client shared keys (docs/explanation-secure-aggregation.md)."""
        return min(clients, int(self.threshold * clients) + 1)

    def skellam_plan(self, clients: int, size: int) -> SkellamPlan | None:
        """Distributed DP's grid and noise for ``clients`` updates of ``size`` values (None: not distributed)."""
        if self.dp is not SecureDp.DISTRIBUTED:
            return None
        return self._skellam_plan(clients, size)

    def _skellam_plan(self, clients: int, size: int) -> SkellamPlan:
        return SkellamPlan.of(clip=self.clip, dp_clip=self.dp_clip, noise_multiplier=self.noise_multiplier,
                              bits=self.bits, clients=clients, size=size, min_survivors=self.min_survivors(clients))

    def settings(self, clients: int, size: int, round_num: int) -> RoundSettings:
        degree = None
        if self.kind is SecureAggregation.SECAGG_PLUS:
            degree = self.degree if self.degree is not None else default_degree(clients)
            degree = None if degree < 2 or degree >= clients - 1 else degree
        plan = self.skellam_plan(clients, size)
        return RoundSettings(round_num=round_num, size=size, quantizer=self.quantizer(clients, size),
                             threshold=self.threshold, degree=degree, graph_seed=self.seed * 1_000_003 + round_num,
                             noise=plan.client_mu if plan else 0.0, bound=plan.bound if plan else math.inf,
                             malicious=self.malicious)

    def aggregate(self, updates: Sequence[Any], round_num: int, *, weights: Sequence[float] | np.ndarray | None = None,
                  dropouts: Dropouts = Dropouts(), rng: np.random.Generator | None = None) -> SecureRound:
        """The mean of ``updates`` (flat float vectors of one length) over the clients whose masked
        vectors arrived, weighted by ``weights`` (examples; None: equal; ignored under DP, whose
        noise is calibrated to the unweighted sum, as TFF's DP aggregators do); raises
        ``TooFewSurvivorsError`` (nothing changed) when it cannot be unmasked.

        Each client sends ``clip(update) * weight / max(weights)`` and its ``weight / max(weights)``
        (the round's largest weight is public to the round), so the mean is the weighted mean."""
        rows = [np.asarray(u, np.float32).ravel() for u in updates]
        if len(rows) < 2:
            raise ValueError(f"Secure aggregation needs the updates of at least 2 clients. Received: {len(rows)}")
        rng = rng if rng is not None else np.random.default_rng([self.seed, round_num])
        scaled = [1.0] * len(rows)
        if self.noise_multiplier > 0:
            rows = [r * min(1.0, self.dp_clip / max(float(np.linalg.norm(r)), 1e-30)) for r in rows]
        elif weights is not None:
            top = max(float(w) for w in weights)
            scaled = [float(w) / top if top > 0 else 1.0 for w in weights]
        settings = self.settings(len(rows), rows[0].size, round_num)
        result, view = run_round(rows, settings, dropouts=dropouts, rng=rng, weights=scaled)
        quantizer, count = settings.quantizer, len(result.clients)
        total = self._noised_total(result, len(rows), rows[0].size, round_num, rng)
        weight = result.weight / quantizer.levels
        if weight <= 0:
            raise SecureAggregationError(f"The clients that survived round {round_num} ({count}) have weight 0 in "
                                         f"all: there is no mean to take.")
        mean = (quantizer.dequantize_mean(total, count).astype(np.float64) * count / weight).astype(np.float32)
        return SecureRound(mean=mean, clients=count,
                           saturated_clients=result.saturated_clients, saturated_values=result.saturated_values,
                           traffic=traffic(view, settings))

    def _noised_total(self, result: SecureSum, clients: int, size: int, round_num: int,
                      rng: np.random.Generator) -> np.ndarray:
        """The survivors' sum as float64 integers: central noise added here, distributed noise decoded."""
        count = len(result.clients)
        plan = self.skellam_plan(clients, size)
        if plan is not None:
            if count < plan.min_survivors:
                raise TooFewSurvivorsError(
                    f"Round {round_num} has {count} survivors; distributed DP releases a sum of at least "
                    f"{plan.min_survivors} (its epsilon is for their noise). The round is void and the model "
                    "unchanged.")
            return plan.decode(result.values, count).astype(np.float64)
        total = result.values.astype(np.float64)
        if self.noise_multiplier > 0:  # in units of quantization steps, so that dequantizing scales it back
            levels = self.quantizer(clients).levels
            total = total + rng.normal(0.0, self.noise_multiplier * self.dp_clip * levels / (2.0 * self.clip),
                                       total.shape)
        return total

    def epsilon(self, *, clients_per_round: int, num_clients: int, rounds: int, delta: float = 1e-5,
                size: int | None = None) -> float:
        """The epsilon the noise spends after ``rounds`` rounds. Central: accounted as ``dp_fixed`` (the
        same clip and noise, sampling without replacement). Distributed: the Skellam bound for updates
        of ``size`` values with the fewest survivors' noise and no amplification by sampling
        (:class:`~tensorfleet.federated.secure.skellam.SkellamPlan`; ``num_clients`` unused)."""
        if self.dp is SecureDp.DISTRIBUTED:
            if size is None:
                raise ValueError("The epsilon of distributed DP depends on the update's size (its rounding): pass "
                                 "size=. Received: size=None")
            return self._skellam_plan(clients_per_round, integer("size", size, minimum=1)).epsilon(rounds=rounds,
                                                                                               delta=delta)
        from tensorfleet.federated.aggregators.dp import epsilon

        return epsilon(noise_multiplier=self.noise_multiplier, clients_per_round=clients_per_round,
                       num_clients=num_clients, rounds=rounds, delta=delta)
