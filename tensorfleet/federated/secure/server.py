"""The server side of SecAgg / SecAgg+: it routes keys and encrypted shares, collects masked
vectors and, from the shares the survivors send, removes the masks from their sum.

It receives only the message records of :mod:`~tensorfleet.federated.secure.messages` (anything
else is refused with a TypeError) and keeps each in :attr:`SecAggServer.view`, everything the
aggregating code was given. It never imports the client side.

Example:
    >>> SecAggServer.__init__.__doc__.split(".")[0]
    'A server for one round of ``settings``'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tensorfleet.federated.secure import keys as crypto, shamir
from tensorfleet.federated.secure.graph import neighbours
from tensorfleet.federated.secure.messages import (
    AdvertisedKeys,
    EncryptedShare,
    MaskedInput,
    NeighbourKeys,
    RoundSettings,
    SecureAggregationError,
    SignedSurvivors,
    SurvivorSignature,
    TooFewSurvivorsError,
    UnmaskingShares,
    UnmaskRequest,
    expect,
)

__all__ = ["SecAggServer", "SecureSum", "ServerView"]


@dataclass
class ServerView:
    """Every message the server received in one round, in the order of the protocol's rounds."""

    keys: list[AdvertisedKeys] = field(default_factory=list)
    shares: list[EncryptedShare] = field(default_factory=list)
    masked: list[MaskedInput] = field(default_factory=list)
    signatures: list[SurvivorSignature] = field(default_factory=list)
    unmasking: list[UnmaskingShares] = field(default_factory=list)


@dataclass(frozen=True)
class SecureSum:
    """The unmasked sum of the survivors' quantized vectors mod ``2 ** bits`` (the values, then the
    saturation counters and the weights), and whose vectors it sums."""

    total: np.ndarray
    clients: tuple[int, ...]

    @property
    def values(self) -> np.ndarray:
        return self.total[:-3]

    @property
    def saturated_clients(self) -> int:
        return int(self.total[-3])

    @property
    def saturated_values(self) -> int:
        return int(self.total[-2])

    @property
    def weight(self) -> int:
        """The sum of the clients' quantized weights (``levels`` each at weight 1)."""
        return int(self.total[-1])


class SecAggServer:
    """The aggregating side of one round (see the module's docstring)."""

    def __init__(self, settings: RoundSettings) -> None:
        """A server for one round of ``settings``. Its inputs are messages; its output a :class:`SecureSum`."""
        self.settings = settings
        self.view = ServerView()
        self._keys: dict[int, AdvertisedKeys] = {}
        self._graph: dict[int, frozenset[int]] = {}
        self._sharing: set[int] = set()
        self._masked: dict[int, np.ndarray] = {}

    def receive_keys(self, keys: Sequence[AdvertisedKeys]) -> list[NeighbourKeys]:
        """Draw the round's graph over the clients that advertised keys; each one's neighbours' keys."""
        received = expect(AdvertisedKeys, keys, "public keys")
        self.view.keys.extend(received)
        self._keys = {k.client: k for k in received}
        order = sorted(self._keys)
        n = len(order)
        if n < 2:
            raise TooFewSurvivorsError(f"Secure aggregation needs at least 2 clients. Received: keys of {n}")
        degree = self.settings.degree if self.settings.degree is None or self.settings.degree < n - 1 else None
        graph = neighbours(n, degree=degree, seed=self.settings.graph_seed)
        self._graph = {order[i]: frozenset(order[j] for j in graph[i]) for i in range(n)}
        return [NeighbourKeys(u, tuple(self._keys[v] for v in sorted(self._graph[u]))) for u in order]

    def route_shares(self, shares: Sequence[EncryptedShare]) -> dict[int, list[EncryptedShare]]:
        """Forward each encrypted share to its recipient (the server cannot read them)."""
        received = expect(EncryptedShare, shares, "shares")
        self.view.shares.extend(received)
        out: dict[int, list[EncryptedShare]] = {}
        for share in received:
            if share.recipient not in self._graph.get(share.sender, ()):
                raise SecureAggregationError(f"Client {share.sender} sent a share to {share.recipient}, who is not "
                                             f"its neighbour.")
            self._sharing.add(share.sender)
            out.setdefault(share.recipient, []).append(share)
        return out

    def receive_masked(self, inputs: Sequence[MaskedInput]) -> UnmaskRequest:
        """Collect the masked vectors; ask the clients for the shares that remove the masks."""
        received = expect(MaskedInput, inputs, "masked vectors")
        self.view.masked.extend(received)
        for item in received:
            if item.client not in self._sharing or item.vector.shape != (self.settings.length,):
                raise SecureAggregationError(f"A masked vector from client {item.client} of shape "
                                             f"{item.vector.shape} does not fit the round (clients that shared "
                                             f"keys: {len(self._sharing)}, length {self.settings.length}).")
            self._masked[item.client] = item.vector
        survivors = frozenset(self._masked)
        return UnmaskRequest(survivors, frozenset(self._sharing - survivors))

    def consistency(self, signatures: Sequence[SurvivorSignature]) -> SignedSurvivors:
        """The malicious-server variant's consistency round: forward every client's signature of the
        survivor list to every client (each checks them against the list it signed)."""
        received = expect(SurvivorSignature, signatures, "survivor signatures")
        self.view.signatures.extend(received)
        return SignedSurvivors(frozenset(self._masked), {item.client: item.signature for item in received})

    def _secret(self, owner: int, kind: str, given: dict[int, np.ndarray], responders: list[int]) -> bytes:
        holders = self._graph[owner] | {owner}
        needed = self.settings.needed(len(holders))
        have = sorted(h for h in given if h in holders)
        if len(have) < needed:
            raise TooFewSurvivorsError(
                f"Secure aggregation round {self.settings.round_num} cannot unmask: client {owner}'s {kind} needs "
                f"{needed} shares of {len(self._graph[owner]) + 1}, and only {len(have)} of the clients holding "
                f"them answered ({len(responders)} answered in all). The round is void and the model unchanged; "
                f"sample more clients or lower the threshold ({self.settings.threshold}).")
        have = have[:needed]
        return shamir.reconstruct([h + 1 for h in have], np.stack([given[h] for h in have]))

    def unmask(self, responses: Sequence[UnmaskingShares]) -> SecureSum:
        """The survivors' sum: their masked vectors less their self masks and less the pairwise
        masks they share with clients that dropped (both rebuilt from ``responses``' shares)."""
        received = expect(UnmaskingShares, responses, "unmasking shares")
        self.view.unmasking.extend(received)
        survivors = sorted(self._masked)
        dropped = sorted(self._sharing - set(survivors))
        responders = [r.client for r in received]
        by_kind: dict[str, dict[int, dict[int, np.ndarray]]] = {"self": {}, "key": {}}
        for response in received:
            for owner, share in response.self_mask_shares.items():
                by_kind["self"].setdefault(owner, {})[response.client] = np.asarray(share)
            for owner, share in response.key_shares.items():
                by_kind["key"].setdefault(owner, {})[response.client] = np.asarray(share)
        settings = self.settings
        total: np.ndarray = np.zeros(settings.length, settings.quantizer.dtype)
        for u in survivors:
            total += self._masked[u]
            seed = self._secret(u, "self-mask seed", by_kind["self"].get(u, {}), responders)
            total -= crypto.expand_mask(crypto.derive(seed, "self", settings.round_num), settings.length,
                                        settings.quantizer.bits)
        for v in dropped:
            key = crypto.private_from_bytes(self._secret(v, "mask key", by_kind["key"].get(v, {}), responders))
            for u in sorted(self._graph[v] & set(survivors)):
                mask = crypto.expand_mask(crypto.derive(key.agree(self._keys[u].mask_public), "mask",
                                                        settings.round_num), settings.length, settings.quantizer.bits)
                if u < v:  # u added +PRG(s_uv)
                    total -= mask
                else:
                    total += mask
        return SecureSum(settings.quantizer.reduce(total), tuple(survivors))
