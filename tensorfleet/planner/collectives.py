"""Collective communication algorithms, executed over logical devices with real tensors.

Every algorithm here runs as a sequence of synchronous *steps*; in each step some nodes send a
tensor (or a chunk of one) to others, the receiver gets a real copy on its own device
(``tf.identity`` under ``tf.device``) and adds or stores it. A :class:`Trace` records how many
values every node sent and received, and, per step, the largest number of values any single
node sent or received (the step's critical path on full-duplex links of equal bandwidth).

The all-reduce algorithms (:data:`COLLECTIVES`: ``ps``, ``naive``, ``ring``, ``tree``,
``butterfly``, ``halving_doubling``) follow the classic comparison in Li et al., "Scaling
Distributed Machine Learning with the Parameter Server" (OSDI 2014), Patarasuk & Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations" (JPDC 2009) and Thakur,
Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH" (IJHPCA
2005). What each sends, by formula, is in :mod:`tensorfleet.planner.traffic`; the executed
traces equal its exact counts.

Example:
    >>> from tensorfleet.planner import collectives
    >>> import numpy as np
    >>> values = [np.full(8, i, np.float32) for i in range(4)]
    >>> out = collectives.all_reduce(values, algorithm="ring")
    >>> out.trace.total_sent, out.trace.num_steps
    (48, 6)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from tensorfleet.registry import Registry
from tensorfleet.validation import integer

__all__ = [
    "AllReduceAlgorithm",
    "COLLECTIVES",
    "CollectiveResult",
    "Trace",
    "algorithm_name",
    "all_gather",
    "all_reduce",
    "broadcast",
    "check_node_count",
    "gather",
]

PS_NODE = "ps"


class AllReduceAlgorithm(str, Enum):
    """The all-reduce algorithms this module executes and models."""

    PS = "ps"
    NAIVE = "naive"
    RING = "ring"
    TREE = "tree"
    BUTTERFLY = "butterfly"
    HALVING_DOUBLING = "halving_doubling"


@dataclass
class Trace:
    """What one collective sent: per-node totals and per-step critical sizes (in values)."""

    sent: dict[Any, int] = field(default_factory=dict)
    received: dict[Any, int] = field(default_factory=dict)
    step_values: list[int] = field(default_factory=list)
    messages: int = 0

    @property
    def num_steps(self) -> int:
        """Sequential communication steps."""
        return len(self.step_values)

    @property
    def total_sent(self) -> int:
        """Values sent by all nodes together (the network traffic)."""
        return sum(self.sent.values())

    @property
    def critical_values(self) -> int:
        """Sum over steps of the busiest node's send or receive volume: time x bandwidth."""
        return sum(self.step_values)


@dataclass
class CollectiveResult:
    """The tensors every node ends with, and the :class:`Trace` of the communication."""

    outputs: list[Any]
    trace: Trace


class _Network:
    """Places nodes on devices and copies tensors between them, counting values."""

    def __init__(self, num_nodes: int, devices: Sequence[str] | None, extra_nodes: Sequence[Any] = ()) -> None:
        import tensorflow as tf

        self._tf = tf
        if devices is None:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        if not devices:
            raise ValueError("At least one device is needed. Received: devices=[]")
        self.devices = list(devices)
        self.nodes: list[Any] = [*range(num_nodes), *extra_nodes]
        self.trace = Trace(sent={n: 0 for n in self.nodes}, received={n: 0 for n in self.nodes})

    def device(self, node: Any) -> str:
        # Nodes beyond the number of devices share devices round-robin; the parameter server
        # sits on the first device. Counting does not depend on the placement.
        index = 0 if node == PS_NODE else int(node)
        return self.devices[index % len(self.devices)]

    def put(self, node: Any, value: Any) -> Any:
        with self._tf.device(self.device(node)):
            return self._tf.identity(self._tf.convert_to_tensor(value))

    def add(self, node: Any, a: Any, b: Any) -> Any:
        with self._tf.device(self.device(node)):
            return self._tf.add(a, b)

    def step(self, messages: Sequence[tuple[Any, Any, Any]]) -> list[Any]:
        """Delivers ``(src, dst, tensor)`` messages in one synchronous step; returns the copies."""
        step_sent: dict[Any, int] = {}
        step_recv: dict[Any, int] = {}
        out = []
        for src, dst, tensor in messages:
            if src == dst:
                raise AssertionError(f"A node cannot send to itself: {src!r}")
            size = int(self._tf.size(tensor))
            with self._tf.device(self.device(dst)):
                out.append(self._tf.identity(tensor))
            self.trace.sent[src] += size
            self.trace.received[dst] += size
            step_sent[src] = step_sent.get(src, 0) + size
            step_recv[dst] = step_recv.get(dst, 0) + size
        self.trace.messages += len(messages)
        self.trace.step_values.append(max([*step_sent.values(), *step_recv.values(), 0]))
        return out


def _check_inputs(values: Sequence[Any]) -> int:
    if not isinstance(values, (list, tuple)) or len(values) < 2:
        raise ValueError(
            f"A collective needs a list of at least 2 per-node tensors. Received: "
            f"{type(values).__name__} of length {len(values) if hasattr(values, '__len__') else '?'}"
        )
    import numpy as np

    sizes = {int(np.size(v)) for v in values}
    if len(sizes) != 1:
        raise ValueError(f"Every node must hold a tensor of the same size. Received sizes: {sorted(sizes)}")
    return len(values)


def _flat(net: _Network, values: Sequence[Any]) -> list[Any]:
    tf = net._tf
    return [net.put(i, tf.reshape(tf.cast(v, tf.float32) if not hasattr(v, "dtype") else v, [-1]))
            for i, v in enumerate(values)]


def _chunks(net: _Network, node: int, tensor: Any, parts: int) -> list[Any]:
    import numpy as np

    sizes = [len(a) for a in np.array_split(np.arange(int(net._tf.size(tensor))), parts)]
    with net._tf.device(net.device(node)):
        return list(net._tf.split(tensor, sizes))


def _concat(net: _Network, node: int, parts: Sequence[Any]) -> Any:
    with net._tf.device(net.device(node)):
        return net._tf.concat(list(parts), axis=0)


# ----------------------------------------------------------------------------- all-reduce


def _ps(net: _Network, x: list[Any]) -> list[Any]:
    n = len(x)
    received = net.step([(i, PS_NODE, x[i]) for i in range(n)])
    total = received[0]
    for r in received[1:]:
        total = net.add(PS_NODE, total, r)
    return net.step([(PS_NODE, i, total) for i in range(n)])


def _naive(net: _Network, x: list[Any]) -> list[Any]:
    n = len(x)
    messages = [(i, j, x[i]) for i in range(n) for j in range(n) if i != j]
    copies = net.step(messages)
    out = list(x)
    for (src, dst, _), copy in zip(messages, copies):
        out[dst] = net.add(dst, out[dst], copy)
    return out


def _ring(net: _Network, x: list[Any]) -> list[Any]:
    n = len(x)
    chunks = [_chunks(net, i, x[i], n) for i in range(n)]
    for s in range(n - 1):  # reduce-scatter
        sends = [(i, (i + 1) % n, chunks[i][(i - s) % n]) for i in range(n)]
        copies = net.step(sends)
        for (src, dst, _), copy in zip(sends, copies):
            c = (src - s) % n
            chunks[dst][c] = net.add(dst, chunks[dst][c], copy)
    for s in range(n - 1):  # all-gather: node i owns the reduced chunk (i + 1) % n
        sends = [(i, (i + 1) % n, chunks[i][(i + 1 - s) % n]) for i in range(n)]
        copies = net.step(sends)
        for (src, dst, _), copy in zip(sends, copies):
            chunks[dst][(src + 1 - s) % n] = copy
    return [_concat(net, i, chunks[i]) for i in range(n)]


def _tree(net: _Network, x: list[Any]) -> list[Any]:
    n = len(x)
    out = list(x)
    levels = max(1, math.ceil(math.log2(n)))
    for level in range(levels):  # binomial reduce to node 0
        d = 1 << level
        sends = [(i, i - d, out[i]) for i in range(n) if i % (2 * d) == d]
        for (src, dst, _), copy in zip(sends, net.step(sends)):
            out[dst] = net.add(dst, out[dst], copy)
    for level in reversed(range(levels)):  # binomial broadcast from node 0
        d = 1 << level
        sends = [(i, i + d, out[i]) for i in range(n) if i % (2 * d) == 0 and i + d < n]
        for (src, dst, _), copy in zip(sends, net.step(sends)):
            out[dst] = copy
    return out


def _butterfly(net: _Network, x: list[Any]) -> list[Any]:
    n = len(x)
    out = list(x)
    for level in range(int(math.log2(n))):
        d = 1 << level
        sends = [(i, i ^ d, out[i]) for i in range(n)]
        copies = net.step(sends)
        new = list(out)
        for (src, dst, _), copy in zip(sends, copies):
            new[dst] = net.add(dst, out[dst], copy)
        out = new
    return out


def _halving_doubling(net: _Network, x: list[Any]) -> list[Any]:
    n = len(x)
    levels = int(math.log2(n))
    chunks = [_chunks(net, i, x[i], n) for i in range(n)]
    lo = [0] * n  # each node's current range of chunk indices [lo, lo + width)
    width = n
    for level in reversed(range(levels)):  # reduce-scatter by recursive halving
        d = 1 << level
        half = width // 2
        sends, keep = [], {}
        for i in range(n):
            partner = i ^ d
            lower = i < partner
            mine = range(lo[i], lo[i] + half) if lower else range(lo[i] + half, lo[i] + width)
            theirs = range(lo[i] + half, lo[i] + width) if lower else range(lo[i], lo[i] + half)
            sends.append((i, partner, _concat(net, i, [chunks[i][c] for c in theirs])))
            keep[i] = mine
        copies = net.step(sends)
        for (src, dst, _), copy in zip(sends, copies):
            parts = _chunks(net, dst, copy, len(keep[dst]))
            for c, part in zip(keep[dst], parts):
                chunks[dst][c] = net.add(dst, chunks[dst][c], part)
        for i in range(n):
            lo[i] = keep[i].start
        width = half
    for level in range(levels):  # all-gather by recursive doubling
        d = 1 << level
        sends = [(i, i ^ d, _concat(net, i, [chunks[i][c] for c in range(lo[i], lo[i] + width)])) for i in range(n)]
        copies = net.step(sends)
        for (src, dst, _), copy in zip(sends, copies):
            for c, part in zip(range(lo[src], lo[src] + width), _chunks(net, dst, copy, width)):
                chunks[dst][c] = part
        for i in range(n):
            lo[i] = min(lo[i], lo[i ^ d])
        width *= 2
    return [_concat(net, i, chunks[i]) for i in range(n)]


COLLECTIVES: Registry[Callable[..., Any]] = Registry("all-reduce algorithm")
COLLECTIVES.register("ps", _ps, aliases=("parameter_server",),
                     description="Every worker pushes to one parameter server, which sums and sends back.")
COLLECTIVES.register("naive", _naive, aliases=("all_to_all",),
                     description="Every node sends its whole tensor to every other node.")
COLLECTIVES.register("ring", _ring, description="Ring reduce-scatter, then ring all-gather (bandwidth-optimal).")
COLLECTIVES.register("tree", _tree, aliases=("binomial_tree",),
                     description="Binomial-tree reduce to node 0, then binomial-tree broadcast.")
COLLECTIVES.register("butterfly", _butterfly, aliases=("recursive_doubling",),
                     description="Recursive doubling: log2 N exchanges of the whole tensor with partner i^2^k.")
COLLECTIVES.register("halving_doubling", _halving_doubling, aliases=("rabenseifner",),
                     description="Recursive-halving reduce-scatter, then recursive-doubling all-gather.")

_POWER_OF_TWO = frozenset({"butterfly", "halving_doubling"})


def algorithm_name(algorithm: str | AllReduceAlgorithm) -> str:
    """The registered name of an all-reduce algorithm given by name, alias or enum member.

    Example:
        >>> algorithm_name("Rabenseifner"), algorithm_name(AllReduceAlgorithm.RING)
        ('halving_doubling', 'ring')
    """
    return COLLECTIVES.canonical(algorithm.value if isinstance(algorithm, AllReduceAlgorithm) else algorithm)


def check_node_count(name: str, n: int) -> None:
    """Refuses ``n`` nodes for an algorithm that cannot run on them (recursive doubling and
    halving need a power of two)."""
    if name in _POWER_OF_TWO and n & (n - 1):
        raise ValueError(f"The {name} algorithm needs a power-of-two number of nodes. Received: N={n}")


def all_reduce(values: Sequence[Any], *, algorithm: str = "ring",
               devices: Sequence[str] | None = None) -> CollectiveResult:
    """Sums one tensor per node so that every node ends with the total.

    Args:
        values: one tensor (or array) per node, all of the same size; node ``i`` starts on
            ``devices[i % len(devices)]``.
        algorithm: a name from :data:`COLLECTIVES` (``ps``, ``naive``, ``ring``, ``tree``,
            ``butterfly``, ``halving_doubling``) or an :class:`AllReduceAlgorithm`.
        devices: device names; defaults to every logical CPU device.

    Returns:
        The flat per-node results (each on its node's device) and the :class:`Trace`.

    Example:
        >>> import numpy as np
        >>> out = all_reduce([np.ones(4), 2 * np.ones(4)], algorithm="ps")
        >>> out.outputs[1].numpy(), out.trace.total_sent
        (array([3., 3., 3., 3.]), 16)
    """
    name = algorithm_name(algorithm)
    n = _check_inputs(values)
    check_node_count(name, n)
    net = _Network(n, devices, extra_nodes=(PS_NODE,) if name == "ps" else ())
    outputs = COLLECTIVES.get(name)(net, _flat(net, values))
    return CollectiveResult(outputs=outputs, trace=net.trace)


def broadcast(value: Any, num_nodes: int, *, root: int = 0, devices: Sequence[str] | None = None) -> CollectiveResult:
    """Copies ``value`` from ``root`` to all ``num_nodes`` nodes along a binomial tree.

    (N-1)·M values in ⌈log2 N⌉ steps.

    Example:
        >>> import numpy as np
        >>> broadcast(np.arange(3.0), 4).trace.num_steps
        2
    """
    num_nodes = integer("num_nodes", num_nodes, minimum=2)
    root = integer("root", root, minimum=0, maximum=num_nodes - 1)
    net = _Network(num_nodes, devices)
    out: list[Any] = [None] * num_nodes
    # Relabel so the root is virtual node 0 of the binomial tree.
    real = lambda v: (v + root) % num_nodes  # noqa: E731
    out[root] = net.put(root, net._tf.reshape(net._tf.convert_to_tensor(value), [-1]))
    for level in reversed(range(max(1, math.ceil(math.log2(num_nodes))))):
        d = 1 << level
        sends = [(real(v), real(v + d), out[real(v)])
                 for v in range(num_nodes) if v % (2 * d) == 0 and v + d < num_nodes]
        for (src, dst, _), copy in zip(sends, net.step(sends)):
            out[dst] = copy
    return CollectiveResult(outputs=out, trace=net.trace)


def gather(values: Sequence[Any], *, root: int = 0, devices: Sequence[str] | None = None) -> CollectiveResult:
    """Every node sends its tensor straight to ``root``: (N-1)·M values in 1 step.

    The root's output is the concatenation in node order; other nodes' outputs are ``None``.

    Example:
        >>> import numpy as np
        >>> gather([np.zeros(2), np.ones(2)]).outputs[0].numpy()
        array([0., 0., 1., 1.])
    """
    n = _check_inputs(values)
    root = integer("root", root, minimum=0, maximum=n - 1)
    net = _Network(n, devices)
    x = _flat(net, values)
    sends = [(i, root, x[i]) for i in range(n) if i != root]
    copies = dict(zip([s[0] for s in sends], net.step(sends)))
    parts = [x[i] if i == root else copies[i] for i in range(n)]
    outputs: list[Any] = [None] * n
    outputs[root] = _concat(net, root, parts)
    return CollectiveResult(outputs=outputs, trace=net.trace)


def all_gather(values: Sequence[Any], *, devices: Sequence[str] | None = None) -> CollectiveResult:
    """Ring all-gather: every node ends with all tensors concatenated in node order.

    N·(N-1)·M values in N-1 steps.

    Example:
        >>> import numpy as np
        >>> all_gather([np.zeros(1), np.ones(1)]).outputs[1].numpy()
        array([0., 1.])
    """
    n = _check_inputs(values)
    net = _Network(n, devices)
    x = _flat(net, values)
    have = [{i: x[i]} for i in range(n)]
    for s in range(n - 1):
        sends = [(i, (i + 1) % n, have[i][(i - s) % n]) for i in range(n)]
        for (src, dst, _), copy in zip(sends, net.step(sends)):
            have[dst][(src - s) % n] = copy
    return CollectiveResult(outputs=[_concat(net, i, [have[i][j] for j in range(n)]) for i in range(n)],
                            trace=net.trace)
