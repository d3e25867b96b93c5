"""Where a simulation's rounds run, chosen in one place: :func:`choose_backend`.

Users choose ``backend=`` and ``workers=``; the choice maps to what runs:

* ``tff``: every round on TFF's runtime, on a worker this process owns
  (:mod:`~tensorfleet.federated.backends.tff`);
* ``tff`` with ``workers=["host:port", ...]``: each round's clients split across running TFF
  workers (:mod:`~tensorfleet.federated.backends.remote`; a worker is started with
  :mod:`~tensorfleet.federated.backends.worker`, on Kubernetes with
  :mod:`~tensorfleet.federated.backends.k8s`);
* ``compiled``: a whole FedAvg-family, FedProx or FedSGD round as one TensorFlow function in this
  process (:mod:`~tensorfleet.federated.backends.compiled`); no TFF process or worker is built,
  federated evaluation included. With ``workers=`` its lanes run on TensorFlow servers
  (:mod:`~tensorfleet.federated.backends.compiled.workers`, ``tensorfleet federated worker``), one
  lane a worker; ``auto`` with workers is this where tensorflow-federated cannot be imported. It refuses what it cannot
  run as TFF does. Its clients train in lanes, one per core;
  :func:`~tensorfleet.federated.backends.threads.configure_threads`, called before TensorFlow starts (``tensorfleet
  federated run`` calls it), gives each lane's ops a thread of their own.
* ``auto`` (the default): ``compiled`` where it gives TFF's result (an algorithm and aggregator
  it runs, no workers, a model without batch-dependent layers), else ``tff``; the model part is
  decided when the simulation is built (:meth:`BackendChoice.resolve`).

``tff`` (and ``workers``) need tensorflow-federated, which only the tff track has: asked for
where it cannot be imported, they fail at once with
:class:`~tensorfleet.compat.tff.TffUnavailableError`, as does ``auto`` for what only TFF runs.

Example:
    >>> choose_backend("compiled", algorithm="fedavg")
    BackendChoice(backend=<Backend.COMPILED: 'compiled'>, workers=None)
    >>> choose_backend("compiled", ["127.0.0.1:8000"], algorithm="fedavg")
    BackendChoice(backend=<Backend.COMPILED: 'compiled'>, workers=('127.0.0.1:8000',))
    >>> choose_backend("auto", algorithm="fedsgd").backend
    <Backend.AUTO: 'auto'>
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

from tensorfleet.validation import choice

__all__ = ["Backend", "BackendChoice", "choose_backend"]


class Backend(str, Enum):
    """What runs the rounds: TFF's runtime, or one compiled TensorFlow function."""

    TFF = "tff"
    COMPILED = "compiled"
    AUTO = "auto"


@dataclass(frozen=True)
class BackendChoice:
    """A checked choice of where rounds run (made by :func:`choose_backend`).

    Attributes:
        backend: ``tff`` or ``compiled``.
        workers: ``host:port`` of the TFF workers the rounds are split across; None: one worker
            this process owns.
    """

    backend: Backend
    workers: tuple[str, ...] | None = None

    @property
    def compiled(self) -> bool:
        """Whether rounds run as one compiled TensorFlow function in this process."""
        return self.backend is Backend.COMPILED

    def resolve(self, clients: Any, model: Any = None) -> "BackendChoice":
        """This choice checked against the data (and the model, once built): ``compiled`` raises
        ValueError for what it cannot run as TFF does; ``auto`` becomes ``tff`` or ``compiled``
        (``auto`` again while ``model`` is None and the data allow ``compiled``)."""
        if self.backend is Backend.TFF:
            return self
        from tensorfleet.federated.backends.compiled import compiled_refusal, unsupported

        reason = compiled_refusal(clients, model)
        if reason is not None and self.backend is Backend.COMPILED:
            raise unsupported(reason)
        if reason is not None:
            _require_tff(f"backend='auto' for what the compiled backend does not run ({reason})")
            return BackendChoice(Backend.TFF)
        return self if model is None else BackendChoice(Backend.COMPILED)

    def install(self) -> Any:
        """Makes TFF's default context run on this choice's workers; returns the runtime (``stop()``
        ends or closes what it started)."""
        if self.workers is None:
            from tensorfleet.federated.backends import tff

            return tff.install_default()
        from tensorfleet.federated.backends import remote

        return remote.install_default(list(self.workers))


def choose_backend(backend: str | Backend = Backend.AUTO, workers: Sequence[str] | str | None = None, *,
                   algorithm: str, aggregator: str | None = None) -> BackendChoice:
    """Checks the user's ``backend`` and ``workers`` against each other and the algorithm.

    Args:
        backend: ``auto`` (the default), ``tff`` or ``compiled``.
        workers: ``host:port`` addresses of running TFF workers (a list or one comma-separated
            string), or None.
        algorithm: the (canonical) algorithm name; ``compiled`` runs those with a client part
            (:func:`~tensorfleet.federated.backends.compiled.scope.compiled_algorithms`), ``tff`` those with a TFF
            builder.
        aggregator: the (canonical) aggregator name; ``compiled`` runs those with a compiled form
            (:func:`~tensorfleet.federated.backends.compiled.scope.compiled_aggregators`), ``tff`` those with a TFF
            form.

    Raises:
        ValueError: an unknown backend, a bad address, or a combination that cannot run.
        TffUnavailableError: the choice runs on TFF, which cannot be imported here.

    Example (on the tff track: workers are TFF's):
        >>> choose_backend("tff", "127.0.0.1:8471,127.0.0.1:8472", algorithm="fedprox").workers
        ('127.0.0.1:8471', '127.0.0.1:8472')
        >>> choose_backend("auto", ["127.0.0.1:8000"], algorithm="fedprox").backend
        <Backend.TFF: 'tff'>
    """
    chosen = choice(Backend, "backend", backend)
    addresses = None
    if workers is not None:
        from tensorfleet.federated.backends.addresses import parse_addresses

        addresses = tuple(str(a) for a in parse_addresses(workers))
    if chosen is Backend.TFF:
        _check_tff_parts(algorithm, aggregator)
        _require_tff("backend='tff'" + (" with workers=" if addresses else ""))
    else:
        from tensorfleet.federated.backends.compiled.scope import runs_compiled, unsupported

        runnable = runs_compiled(algorithm, aggregator)
        if chosen is Backend.AUTO:
            if runnable and addresses is None:
                return BackendChoice(Backend.AUTO, None)
            from tensorfleet.compat.tff import tff_available

            if runnable and not tff_available():  # workers without TFF: TensorFlow's (the current track)
                return BackendChoice(Backend.COMPILED, addresses)
            _check_tff_parts(algorithm, aggregator)
            _require_tff(f"backend='auto' with workers={list(addresses)}" if addresses is not None else
                         f"backend='auto' for algorithm={algorithm!r}, aggregator={aggregator!r}")
            return BackendChoice(Backend.TFF, addresses)
        if not runnable:
            raise unsupported(f"algorithm={algorithm!r}, aggregator={aggregator!r}")
    return BackendChoice(chosen, addresses)


def _check_tff_parts(algorithm: str, aggregator: str | None) -> None:
    """ValueError when ``algorithm`` or ``aggregator`` has no TFF form (it runs on the compiled backend only)."""
    from tensorfleet.federated.aggregators import AGGREGATORS
    from tensorfleet.federated.algorithms import ALGORITHMS

    if ALGORITHMS.get(algorithm).build is None:
        raise ValueError(f"Algorithm {algorithm!r} runs on the compiled backend only (TFF has none). "
                         f"Received: algorithm={algorithm!r} on the tff backend; use backend='compiled' or 'auto' "
                         f"without workers.")
    if aggregator is not None and aggregator in AGGREGATORS and AGGREGATORS.get(aggregator).tff is None:
        raise ValueError(f"Aggregator {aggregator!r} runs on the compiled backend only (it has no TFF form). "
                         f"Received: aggregator={aggregator!r} on the tff backend; use backend='compiled' or 'auto' "
                         f"without workers.")


def _require_tff(what: str) -> None:
    """:class:`~tensorfleet.compat.tff.TffUnavailableError` saying that ``what`` runs on TFF, where it
    cannot be imported."""
    from tensorfleet.compat.tff import TFF_TRACK_HINT, TffUnavailableError, tff_available

    if not tff_available():
        raise TffUnavailableError(f"{what} runs rounds on tensorflow-federated, which cannot be imported here. "
                                  f"{TFF_TRACK_HINT}.")
