"""Secure aggregation that is secure in simulation: SecAgg (Bonawitz et al., CCS 2017) and SecAgg+
(Bell et al., CCS 2020) with real cryptography (X25519, HKDF, AES from ``cryptography``), Shamir
t-of-n sharing and masks mod ``2 ** bits``; DP's noise on the unmasked sum or, distributed, Skellam
noise added by each client before masking; and the malicious-server variant (Ed25519-signed keys,
a consistency round). The server side
(:class:`~tensorfleet.federated.secure.server.SecAggServer`) receives only masked vectors, opaque
encrypted shares, public keys and the shares it needs to unmask the sum.

Example:
    >>> import numpy as np
    >>> from tensorfleet.federated.secure import SecureAggregator
    >>> result = SecureAggregator(kind="secagg", clip=1.0, bits=20).aggregate(
    ...     [np.zeros(3), np.full(3, 0.5)], round_num=0)
    >>> np.round(result.mean, 3).tolist()
    [0.25, 0.25, 0.25]
"""

from tensorfleet.federated.secure.messages import InconsistentViewError, SecureAggregationError, TooFewSurvivorsError
from tensorfleet.federated.secure.protocol import (
    Dropouts,
    SecureAggregation,
    SecureAggregator,
    SecureDp,
    SecureRound,
    run_round,
    traffic,
)
from tensorfleet.federated.secure.quantize import Quantizer
from tensorfleet.federated.secure.skellam import SkellamPlan

# isort: split
# Imported last for its side effect, registering secagg and secagg+; the split keeps the import sorter off it.
from tensorfleet.federated.secure import part as _part  # noqa: E402,F401  registers secagg and secagg+

__all__ = ["Dropouts", "InconsistentViewError", "Quantizer", "SecureAggregation", "SecureAggregationError",
           "SecureAggregator", "SecureDp", "SecureRound", "SkellamPlan", "TooFewSurvivorsError", "run_round", "traffic"]
