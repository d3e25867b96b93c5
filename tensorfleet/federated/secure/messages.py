"""What travels between the clients and the server in one round of secure aggregation, and the
settings every party knows. These frozen records are the only things the server side receives:
:class:`~tensorfleet.federated.secure.server.SecAggServer` takes nothing else (a type boundary), and
none of them holds a client's plaintext (a masked vector, opaque ciphertexts, public keys and the
shares the protocol allows the server to collect).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from tensorfleet.federated.secure.quantize import Quantizer
from tensorfleet.validation import integer, number

__all__ = ["AdvertisedKeys", "EncryptedShare", "InconsistentViewError", "MaskedInput", "NeighbourKeys",
           "RoundSettings", "SecureAggregationError", "SignedSurvivors", "SurvivorSignature", "TooFewSurvivorsError",
           "UnmaskRequest", "UnmaskingShares", "expect", "keys_payload", "survivors_payload"]

# Appended to every masked vector: [saturated at all (0/1), saturated values (capped at levels), weight * levels].
COUNTERS = 3


class SecureAggregationError(ValueError):
    """A round of secure aggregation that cannot give a correct sum (the model stays as it was)."""


class TooFewSurvivorsError(SecureAggregationError):
    """Fewer clients answered than the threshold needs to unmask the sum."""


class InconsistentViewError(SecureAggregationError):
    """A client of the malicious-server variant aborts: a signature does not verify (a substituted
    key, or survivor lists that differ between clients); it released no share."""


@dataclass(frozen=True)
class RoundSettings:
    """What every party of a round knows: the round, the vector length (``size`` values, plus the
    saturation counters and the weight), the quantizer (modulus, clip, clients), the graph's ``degree`` (None:
    every pair, SecAgg) and ``graph_seed``, and the ``threshold`` as a share of each client's share
    holders (its neighbours and itself): a secret needs ``floor(threshold * holders) + 1`` shares.

    Distributed DP: each client adds Skellam noise of variance ``noise`` to its values and redraws its
    rounding until its centred integer vector's L2 norm is at most ``bound``
    (:mod:`~tensorfleet.federated.secure.skellam`). ``malicious``: keys are signed and survivor lists
    checked (Bonawitz et al. 2017, section 6), every client holding a registered identity."""

    round_num: int
    size: int
    quantizer: Quantizer
    threshold: float = 0.5
    degree: int | None = None
    graph_seed: int = 0
    noise: float = 0.0
    bound: float = math.inf
    malicious: bool = False

    def __post_init__(self) -> None:
        integer("round_num", self.round_num, minimum=0)
        integer("size", self.size, minimum=1)
        number("threshold", self.threshold, minimum=0, below=1)
        integer("degree", self.degree, minimum=2, optional=True)
        number("noise", self.noise, minimum=0)

    @property
    def length(self) -> int:
        """The masked vector's length: the values, the saturation counters and the weight."""
        return self.size + COUNTERS

    def needed(self, holders: int) -> int:
        """How many of ``holders`` shares rebuild a secret."""
        return min(holders, int(self.threshold * holders) + 1)


def expect(kind: type, items: Any, what: str) -> list[Any]:
    """``items`` as a list, each checked to be a ``kind`` (the server's boundary)."""
    out = list(items)
    for item in out:
        if type(item) is not kind:
            raise TypeError(f"The secure aggregation server takes {what} only as {kind.__name__} messages. "
                            f"Received: {type(item).__name__}")
    return out


def keys_payload(round_num: int, client: int, cipher_public: bytes, mask_public: bytes) -> bytes:
    """What a client signs of its advertised keys (the malicious-server variant)."""
    return b"tensorfleet secagg keys" + struct.pack("<II", round_num, client) + cipher_public + mask_public


def survivors_payload(round_num: int, survivors: frozenset[int]) -> bytes:
    """What a client signs of the survivor list it was shown (the consistency check)."""
    ids = sorted(survivors)
    return b"tensorfleet secagg survivors" + struct.pack(f"<II{len(ids)}I", round_num, len(ids), *ids)


@dataclass(frozen=True)
class AdvertisedKeys:
    """Round 0, client -> server: the client's two X25519 public keys (share encryption, masks), and
    in the malicious-server variant its Ed25519 signature of them under its registered identity."""

    client: int
    cipher_public: bytes
    mask_public: bytes
    signature: bytes = b""


@dataclass(frozen=True)
class NeighbourKeys:
    """Server -> client: the advertised keys of the client's neighbours in the round's graph."""

    client: int
    keys: tuple[AdvertisedKeys, ...]


@dataclass(frozen=True)
class EncryptedShare:
    """Round 1, client -> server -> client: ``sender``'s shares of its two secrets for ``recipient``,
    encrypted under a key the two agreed (the server only forwards it)."""

    sender: int
    recipient: int
    ciphertext: bytes


@dataclass(frozen=True)
class MaskedInput:
    """Round 2, client -> server: the client's quantized vector plus its masks, mod ``2 ** bits``."""

    client: int
    vector: np.ndarray

    def __post_init__(self) -> None:
        self.vector.setflags(write=False)


@dataclass(frozen=True)
class UnmaskRequest:
    """Server -> clients: whose masked vectors arrived (``survivors``: send their self-mask seed's
    shares) and who shared keys but sent none (``dropped``: send their mask key's shares)."""

    survivors: frozenset[int]
    dropped: frozenset[int]


@dataclass(frozen=True)
class UnmaskingShares:
    """Round 3, client -> server: the shares ``client`` holds of survivors' self-mask seeds and of
    dropped clients' mask keys (never both for one client)."""

    client: int
    self_mask_shares: Mapping[int, np.ndarray]
    key_shares: Mapping[int, np.ndarray]


@dataclass(frozen=True)
class SurvivorSignature:
    """Consistency round, client -> server: ``client``'s signature of the survivor list it was shown."""

    client: int
    signature: bytes


@dataclass(frozen=True)
class SignedSurvivors:
    """Server -> clients: the survivor list and every signature the server collected of it; a client
    releases shares only when each verifies over the list it signed itself."""

    survivors: frozenset[int]
    signatures: Mapping[int, bytes]
