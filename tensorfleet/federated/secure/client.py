"""The client side of SecAgg / SecAgg+ (Bonawitz et al., CCS 2017, semi-honest variant; Bell et al.,
CCS 2020, for the sparse graph). A client keeps its update and its secrets to itself and hands out
only the messages of :mod:`~tensorfleet.federated.secure.messages`:

0. two X25519 key pairs (one encrypts shares, one agrees masks), their public halves advertised;
1. a random self-mask seed ``b`` and the mask key's private half, each split t-of-n (Shamir) among
   the client's neighbours and itself, each neighbour's shares encrypted for it;
2. its quantized update plus ``PRG(b)`` plus, for each neighbour ``v`` that shared keys,
   ``+PRG(s_uv)`` if ``u < v`` else ``-PRG(s_uv)``, mod ``2 ** bits`` (the pairwise masks cancel in the sum);
3. the shares it holds of the survivors' ``b`` and of the dropped clients' mask keys.

With distributed DP (``settings.noise > 0``) step 2 quantizes by conditional randomized rounding
and adds Skellam noise to the values before masking
(:mod:`~tensorfleet.federated.secure.skellam`). In the malicious-server variant
(``settings.malicious``, Bonawitz et al. 2017, section 6) the client signs its public keys with its
registered Ed25519 identity and refuses neighbours' keys whose signature fails; before step 3 it
signs the survivor list it was shown (:meth:`SecAggClient.sign_survivors`) and releases shares only
when every signature the server forwards verifies over that same list
(:class:`~tensorfleet.federated.secure.messages.InconsistentViewError` otherwise, nothing released).
"""

from __future__ import annotations

import os
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from tensorfleet.federated.secure import keys as crypto, shamir
from tensorfleet.federated.secure.messages import (
    AdvertisedKeys,
    EncryptedShare,
    InconsistentViewError,
    MaskedInput,
    NeighbourKeys,
    RoundSettings,
    SecureAggregationError,
    SignedSurvivors,
    SurvivorSignature,
    UnmaskingShares,
    UnmaskRequest,
    keys_payload,
    survivors_payload,
)
from tensorfleet.federated.secure.skellam import skellam_noise

__all__ = ["SecAggClient", "masks_of"]

_SHARE_BYTES = 2 * shamir.WORDS * 4
_ROUNDING_DRAWS = 200  # conditional rounding keeps a draw with probability >= 1 - exp(-1/2) each


def _header(sender: int, recipient: int, round_num: int) -> bytes:
    return struct.pack("<III", sender, recipient, round_num)


def masks_of(settings: RoundSettings, client: int, mask_pair: crypto.KeyPair, peers: dict[int, bytes],
             self_seed: bytes) -> np.ndarray:
    """The sum of ``client``'s masks mod ``2 ** bits``: its self mask and one pairwise mask per peer
    (``peers``: id -> mask public key); what the server rebuilds for the parts it may."""
    bits, length = settings.quantizer.bits, settings.length
    total = crypto.expand_mask(crypto.derive(self_seed, "self", settings.round_num), length, bits)
    for v, public in peers.items():
        mask = crypto.expand_mask(crypto.derive(mask_pair.agree(public), "mask", settings.round_num), length, bits)
        if client < v:
            total += mask
        else:
            total -= mask
    return total


class SecAggClient:
    """One client's part in one round. Its update and secrets stay in this object; every method
    returns messages only.

    Args:
        client: the client's id in the round (0 to clients - 1).
        settings: the round's :class:`RoundSettings`.
        rng: draws the stochastic rounding of quantization and distributed DP's noise (secrets come
            from the OS's CSPRNG).
        identity: the client's signing key (the malicious-server variant).
        pki: every client's registered Ed25519 public key, by id (the malicious-server variant).
    """

    def __init__(self, client: int, settings: RoundSettings, rng: np.random.Generator,
                 identity: crypto.Identity | None = None, pki: Mapping[int, bytes] | None = None) -> None:
        if settings.malicious and (identity is None or pki is None):
            raise ValueError(f"Client {client} of a malicious-server round needs its identity and the registered "
                             f"public keys (pki). Received: identity={identity is not None}, pki={pki is not None}")
        self._identity = identity
        self._pki = dict(pki or {})
        self._signed: frozenset[int] | None = None
        self._plain: np.ndarray | None = None  # the quantized values, and below the noise: never sent
        self._noise: np.ndarray | None = None
        self.client = client
        self._settings = settings
        self._rng = rng
        self._cipher = crypto.KeyPair.generate()
        self._mask = crypto.KeyPair.generate()
        self._self_seed = os.urandom(shamir.SECRET_BYTES)
        self._neighbours: dict[int, AdvertisedKeys] = {}
        self._held: dict[int, np.ndarray] = {}  # sender -> [2, WORDS] shares (self seed, mask key)
        self._channels: dict[int, bytes] = {}
        self.saturated = 0

    def _sign(self, payload: bytes) -> bytes:
        assert self._identity is not None  # a malicious-server round has one (__init__); only it signs
        return self._identity.sign(payload)

    def advertise(self) -> AdvertisedKeys:
        cipher, mask = self._cipher.public, self._mask.public
        if not self._settings.malicious:
            return AdvertisedKeys(self.client, cipher, mask)
        payload = keys_payload(self._settings.round_num, self.client, cipher, mask)
        return AdvertisedKeys(self.client, cipher, mask, self._sign(payload))

    def _check_signed(self, keys: AdvertisedKeys) -> None:
        registered = self._pki.get(keys.client)
        payload = keys_payload(self._settings.round_num, keys.client, keys.cipher_public, keys.mask_public)
        if registered is None or not crypto.verify(registered, keys.signature, payload):
            raise InconsistentViewError(
                f"Client {self.client} aborts round {self._settings.round_num}: the keys given for client "
                f"{keys.client} are not signed by its registered identity (substituted keys); no share released.")

    def _channel(self, other: AdvertisedKeys) -> bytes:
        """The key of the share channel with ``other`` (one X25519 agreement serves both directions)."""
        if other.client not in self._channels:
            secret = self._cipher.agree(other.cipher_public)
            self._channels[other.client] = crypto.derive(secret, "share", self._settings.round_num, 32)
        return self._channels[other.client]

    def share_keys(self, neighbour_keys: NeighbourKeys) -> list[EncryptedShare]:
        """Split the self-mask seed and the mask key among the neighbours and this client."""
        self._neighbours = {k.client: k for k in neighbour_keys.keys if k.client != self.client}
        if self._settings.malicious:
            for keys in self._neighbours.values():
                self._check_signed(keys)
        holders = sorted([*self._neighbours, self.client])
        shares = shamir.split([self._self_seed, self._mask.private_bytes()], [h + 1 for h in holders],
                              threshold=self._settings.needed(len(holders)))
        out = []
        for i, h in enumerate(holders):
            payload = shares[:, i].astype("<u4").tobytes()
            if h == self.client:
                self._held[h] = shares[:, i]
                continue
            header = _header(self.client, h, self._settings.round_num)
            out.append(EncryptedShare(self.client, h, crypto.encrypt(self._channel(self._neighbours[h]), header,
                                                                     payload)))
        return out

    def receive_shares(self, shares: Sequence[EncryptedShare]) -> None:
        """Decrypt the shares neighbours sent this client (authenticated: sender, recipient, round)."""
        for share in shares:
            sender = self._neighbours.get(share.sender)
            if sender is None or share.recipient != self.client:
                raise SecureAggregationError(f"Client {self.client} received a share from {share.sender} for "
                                             f"{share.recipient}, who is not its neighbour in this round.")
            payload = crypto.decrypt(self._channel(sender), _header(share.sender, self.client,
                                                                    self._settings.round_num), share.ciphertext)
            self._held[share.sender] = np.frombuffer(payload, "<u4").astype(np.int64).reshape(2, shamir.WORDS)

    def masked_input(self, update: Any, weight: float = 1.0) -> MaskedInput:
        """The update clipped, times ``weight`` (0 to 1), quantized, with the saturation counters and
        the quantized weight, plus the masks of every neighbour whose shares arrived."""
        settings, quantizer = self._settings, self._settings.quantizer
        values = np.asarray(update).ravel()
        if values.size != settings.size:
            raise ValueError(f"Client {self.client}'s update has {values.size} values; the round aggregates "
                             f"{settings.size}. Received: {values.size}")
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"A client's weight in secure aggregation is from 0 to 1. Received: weight={weight}")
        clip = quantizer.clip
        ints = self._quantized(np.clip(values, -clip, clip) * weight)
        self.saturated = int(np.count_nonzero(np.abs(values) > clip))
        scaled = weight * quantizer.levels
        counters = np.asarray([self.saturated > 0, min(self.saturated, quantizer.levels),
                               np.floor(scaled) + (self._rng.random() < scaled - np.floor(scaled))], quantizer.dtype)
        peers = {v: self._neighbours[v].mask_public for v in self._held if v != self.client}
        vector = np.concatenate([ints, counters]) + masks_of(settings, self.client, self._mask, peers,
                                                             self._self_seed)
        return MaskedInput(self.client, quantizer.reduce(vector))

    def _quantized(self, values: np.ndarray) -> np.ndarray:
        """``values`` quantized; with distributed DP by conditional rounding (redrawn until the centred
        vector's norm is within ``settings.bound``) and plus Skellam noise, mod ``2 ** bits``."""
        settings, quantizer = self._settings, self._settings.quantizer
        ints, _ = quantizer.quantize(values, self._rng)
        if settings.noise <= 0:
            return ints
        for _ in range(_ROUNDING_DRAWS):
            if float(np.linalg.norm(ints.astype(np.float64) - quantizer.levels / 2.0)) <= settings.bound:
                break
            ints, _ = quantizer.quantize(values, self._rng)
        else:
            raise SecureAggregationError(f"Client {self.client}'s rounding exceeded the norm bound "
                                         f"{settings.bound:.6g} in {_ROUNDING_DRAWS} draws (each succeeds with "
                                         "probability >= 0.39).")
        self._plain = ints.copy()
        self._noise = skellam_noise(self._rng, settings.noise, ints.size)
        return quantizer.reduce(ints.astype(np.int64) + self._noise)

    def sign_survivors(self, request: UnmaskRequest) -> SurvivorSignature:
        """The malicious-server variant's consistency round: sign the survivor list shown to this client."""
        needed = self._settings.needed(len(self._neighbours) + 1)
        if self.client not in request.survivors or len(request.survivors) < needed:
            raise InconsistentViewError(f"Client {self.client} aborts round {self._settings.round_num}: the survivor "
                                        f"list must hold it and at least {needed} clients. Received: "
                                        f"{sorted(request.survivors)[:20]}")
        self._signed = request.survivors
        return SurvivorSignature(self.client, self._sign(
            survivors_payload(self._settings.round_num, request.survivors)))

    def _check_view(self, request: UnmaskRequest, proof: SignedSurvivors | None) -> None:
        """Every forwarded signature verifies over the list this client signed, from enough clients."""
        round_num = self._settings.round_num
        if self._signed is None or proof is None or request.survivors != self._signed:
            raise InconsistentViewError(f"Client {self.client} aborts round {round_num}: it is asked to unmask for "
                                        f"a survivor list it did not sign; no share released.")
        payload = survivors_payload(round_num, self._signed)
        bad = sorted(v for v, sig in proof.signatures.items()
                     if v not in self._signed or not crypto.verify(self._pki.get(v, bytes(32)), sig, payload))
        needed = self._settings.needed(len(self._neighbours) + 1)
        if bad or len(proof.signatures) < needed:
            raise InconsistentViewError(
                f"Client {self.client} aborts round {round_num}: the survivor lists differ between clients "
                f"(signatures of clients {bad[:20]} do not verify over the list it signed, "
                f"{len(proof.signatures) - len(bad)} do, {needed} needed); no share released.")

    def unmask(self, request: UnmaskRequest, proof: SignedSurvivors | None = None) -> UnmaskingShares:
        """The shares this client holds of the survivors' self-mask seeds and the dropped clients'
        mask keys; refuses a request that names a client on both sides (that would unmask it), and
        in the malicious-server variant one whose survivor list ``proof`` does not show every signer saw."""
        if self._settings.malicious:
            self._check_view(request, proof)
        if request.survivors & request.dropped:
            raise SecureAggregationError(f"Client {self.client} refuses to reveal both secrets of clients "
                                         f"{sorted(request.survivors & request.dropped)}.")
        return UnmaskingShares(self.client,
                               {v: s[0] for v, s in self._held.items() if v in request.survivors},
                               {v: s[1] for v, s in self._held.items() if v in request.dropped})
