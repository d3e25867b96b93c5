"""Key agreement, key derivation, share encryption and mask expansion, from the ``cryptography``
package: X25519 (RFC 7748) agrees a secret between two clients; HKDF-SHA256 (RFC 5869) derives
from it a key for one purpose and one round; AES-GCM encrypts the shares one client sends another
through the server; AES-128 in counter mode expands a 16-byte key into a mask of any length.

Example:
    >>> a, b = KeyPair.generate(), KeyPair.generate()
    >>> derive(a.agree(b.public), "mask", 3) == derive(b.agree(a.public), "mask", 3)
    True
    >>> expand_mask(bytes(16), 4, 32).dtype
    dtype('uint32')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tensorfleet.federated.secure.quantize import modulus_dtype

__all__ = ["KEY_BYTES", "SIGNATURE_BYTES", "Identity", "KeyPair", "decrypt", "derive", "encrypt", "expand_mask",
           "private_from_bytes", "verify"]

KEY_BYTES = 32
SIGNATURE_BYTES = 64
def _raw(public: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair; :attr:`public` is the 32 bytes a client advertises."""

    private: X25519PrivateKey
    public: bytes

    @classmethod
    def generate(cls) -> "KeyPair":
        return cls.of(X25519PrivateKey.generate())

    @classmethod
    def of(cls, private: X25519PrivateKey) -> "KeyPair":
        return cls(private, _raw(private.public_key()))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption())

    def agree(self, public: bytes) -> bytes:
        """The X25519 secret shared with the holder of ``public``."""
        return self.private.exchange(X25519PublicKey.from_public_bytes(public))


@dataclass(frozen=True)
class Identity:
    """A client's long-term Ed25519 signing key (RFC 8032); :attr:`public` (32 bytes) is what a PKI
    registers for it, outside the protocol."""

    private: Ed25519PrivateKey
    public: bytes

    @classmethod
    def generate(cls) -> "Identity":
        private = Ed25519PrivateKey.generate()
        return cls(private, _raw(private.public_key()))

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


@functools.lru_cache(maxsize=1 << 16)
def verify(public: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``data`` by the holder of ``public``. A pure
    function of its three inputs: a simulation, whose clients each verify the same signatures of a
    round, computes it once per distinct triple (a deployment's clients each verify their own)."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def private_from_bytes(raw: bytes) -> KeyPair:
    """The key pair of a private key's 32 raw bytes (as rebuilt from Shamir shares)."""
    return KeyPair.of(X25519PrivateKey.from_private_bytes(raw))


def derive(secret: bytes, purpose: str, round_num: int, length: int = 16) -> bytes:
    """A ``length``-byte key for ``purpose`` in round ``round_num`` from an agreed ``secret``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                info=f"tensorfleet secagg {purpose} {round_num}".encode()).derive(secret)


@functools.lru_cache(maxsize=4)
def _zeros(nbytes: int) -> bytes:
    return bytes(nbytes)


def expand_mask(key: bytes, size: int, bits: int) -> np.ndarray:
    """``size`` pseudo-random words mod ``2 ** bits`` (uint32 or uint64) from a 16-byte ``key``:
    the AES-128-CTR keystream (counter from 0), written straight into the array's memory."""
    dtype = np.dtype(modulus_dtype(bits))
    nbytes = size * dtype.itemsize
    out = np.empty(nbytes + 15, np.uint8)  # update_into wants room for a block more than it writes
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    encryptor.update_into(_zeros(nbytes), memoryview(out))
    return out[:nbytes].view(dtype)


def encrypt(key: bytes, header: bytes, payload: bytes) -> bytes:
    """AES-GCM of ``payload`` under a 32-byte ``key``, ``header`` authenticated (nonce 0: each
    key encrypts one message)."""
    return AESGCM(key).encrypt(bytes(12), payload, header)


def decrypt(key: bytes, header: bytes, ciphertext: bytes) -> bytes:
    return AESGCM(key).decrypt(bytes(12), ciphertext, header)
