"""dp-accounting: what tensorfleet reads of its RDP accountant beyond the public API.

dp-accounting (0.4.3 on the tff track, 0.6 on the current one) has no public reader of an
:class:`~dp_accounting.rdp.RdpAccountant`'s orders and RDP values, only ``get_epsilon``, which
recomputes the whole composition. :func:`tensorfleet.federated.aggregators.dp.epsilon` accounts one
round once and scales its RDP by the number of rounds (what ``SelfComposedDpEvent`` does), so it
reads them here: both releases keep them as ``_orders`` and ``_rdp``.

Example:
    >>> import dp_accounting
    >>> accountant = dp_accounting.rdp.RdpAccountant()
    >>> _ = accountant.compose(dp_accounting.GaussianDpEvent(1.0))
    >>> orders, rdp = rdp_orders_and_values(accountant)
    >>> len(orders) == len(rdp), float(rdp[list(orders).index(2.0)])   # RDP of order a: a / (2 sigma^2)
    (True, 1.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["rdp_orders_and_values"]


def rdp_orders_and_values(accountant: Any) -> tuple[Any, np.ndarray]:
    """``(orders, RDP at each order)`` of an ``RdpAccountant`` after its compositions (a copy of the values).

    Raises:
        TypeError: ``accountant`` is not an RDP accountant of a dp-accounting release that keeps them.
    """
    orders = getattr(accountant, "_orders", None)
    rdp = getattr(accountant, "_rdp", None)
    if orders is None or rdp is None:
        raise TypeError(f"Expected a dp_accounting.rdp.RdpAccountant holding _orders and _rdp (dp-accounting 0.4.3 "
                        f"to 0.6). Received: {type(accountant).__module__}.{type(accountant).__qualname__}")
    return orders, np.array(rdp, dtype=np.float64, copy=True)
