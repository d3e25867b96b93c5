"""Judging a fitted cost model honestly: the sizes it was fitted on are not evidence, the others are.

A link fitted to measured all-reduces (:func:`~tensorfleet.planner.cost_model.fit_link`) is
judged here by three rules:

* errors on the sizes the fit used and on the sizes it never saw are kept apart
  (:class:`LinkCheck` ``fitted`` and ``held_out``); only the held-out ones test the model;
* which model is "of record" for an implementation (the plain alpha-beta line or the
  cache-aware link) is the caller's choice, made before measuring: :func:`verdict` takes it as
  an argument, judges that model only, and never falls back to another when it cannot be fitted;
* a rate that one fitted size alone decides (:func:`~tensorfleet.planner.cost_model.fit_support`)
  -- the rate beyond the cache fitted from the one size above it, say -- is named, with the
  held-out sizes that test it: the fit passes through that one point, so its error there is
  zero by construction.

Example:
    >>> from tensorfleet.planner import cost_model, fit_check
    >>> true = cost_model.Link(alpha=1e-4, beta=1e-10, cache_bytes=2**25, beta_uncached=3e-10)
    >>> sizes = [2.0**k for k in range(10, 29, 2)]
    >>> measured = {s: cost_model.predict("ps", 4, s, true) for s in sizes}
    >>> check = fit_check.check_link("ps", 4, measured, sizes[::2], model="cache-aware", cache_bytes=2**25)
    >>> check.single_point, check.tested_by("beta_uncached")
    ({'beta_uncached': 67108864.0}, (268435456.0,))
    >>> check.held_out.count, check.held_out.within
    (5, 5)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Collection, Mapping

from tensorfleet.planner.collectives import AllReduceAlgorithm
from tensorfleet.planner.cost_model import Link, fit_link, fit_support, predict
from tensorfleet.validation import number

__all__ = ["MODELS", "ErrorSummary", "LinkCheck", "check_link", "human_size", "verdict"]

MODELS = ("alpha-beta", "cache-aware")


def human_size(size: float) -> str:
    """``64 MiB``, ``16 KiB`` or ``512 B``.

    Example:
        >>> human_size(2**26), human_size(3 * 2**10)
        ('64 MiB', '3 KiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size:g} B"


@dataclass(frozen=True)
class ErrorSummary:
    """Relative errors ``(predicted - measured) / measured`` of a set of sizes."""

    errors: dict[float, float]
    tolerance: float = 0.25

    @property
    def count(self) -> int:
        return len(self.errors)

    @property
    def within(self) -> int:
        """Sizes predicted within the tolerance, either way."""
        return sum(abs(e) <= self.tolerance for e in self.errors.values())

    @property
    def missed(self) -> dict[float, float]:
        return {s: e for s, e in sorted(self.errors.items()) if abs(e) > self.tolerance}

    @property
    def median_abs(self) -> float | None:
        return statistics.median(abs(e) for e in self.errors.values()) if self.errors else None

    @property
    def max_abs(self) -> float | None:
        return max(abs(e) for e in self.errors.values()) if self.errors else None

    def upto(self, max_size: float | None) -> ErrorSummary:
        """The same errors for sizes up to ``max_size`` (all when None)."""
        kept = {s: e for s, e in self.errors.items() if max_size is None or s <= max_size}
        return ErrorSummary(kept, self.tolerance)

    def describe(self) -> str:
        """``3/4 within 25%, median |error| 8%, worst 31%`` (or ``none``)."""
        if not self.errors:
            return "none"
        return (f"{self.within}/{self.count} within {self.tolerance:.0%}, median |error| {self.median_abs:.0%}, "
                f"worst {self.max_abs:.0%}")


@dataclass(frozen=True)
class LinkCheck:
    """One model fitted to one implementation's measurements, judged on the sizes it did not see."""

    model: str
    link: Link
    fitted: ErrorSummary
    held_out: ErrorSummary
    single_point: dict[str, float]
    held_out_support: dict[str, tuple[float, ...]]

    @property
    def errors(self) -> dict[float, float]:
        """Every size's relative error, fitted and held out."""
        return dict(sorted({**self.fitted.errors, **self.held_out.errors}.items()))

    def tested_by(self, parameter: str) -> tuple[float, ...]:
        """The held-out sizes whose prediction depends on ``parameter`` (e.g. beyond the cache)."""
        return self.held_out_support.get(parameter, ())

    def caveats(self) -> list[str]:
        """One sentence per rate that a single fitted size decides."""
        return [f"{parameter} is decided by {human_size(size)} alone (its error there is 0 by construction); "
                f"held-out sizes that test it: "
                + (", ".join(f"{human_size(s)} {self.held_out.errors[s]:+.0%}" for s in self.tested_by(parameter))
                   or "none")
                for parameter, size in self.single_point.items()]


def check_link(
    algorithm: str | AllReduceAlgorithm,
    n: int,
    measured: Mapping[float, float],
    fit_sizes: Collection[float],
    *,
    model: str = "alpha-beta",
    cache_bytes: float | None = None,
    tolerance: float = 0.25,
) -> LinkCheck:
    """Fits ``model`` on the measured sizes in ``fit_sizes`` and predicts every measured size.

    Args:
        algorithm, n: the step model the implementation follows (see :func:`~tensorfleet.planner.cost_model.predict`).
        measured: seconds by size in bytes.
        fit_sizes: the sizes to fit on, chosen before measuring; every other measured size is held out.
        model: ``alpha-beta`` or ``cache-aware`` (which needs ``cache_bytes``).
        tolerance: the relative error counted as a hit.

    Raises:
        ValueError: for an unknown model, a cache-aware model without a cache, or a fit that
            :func:`~tensorfleet.planner.cost_model.fit_link` cannot make.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(repr(m) for m in MODELS)}. Received: model={model!r}")
    if model == "cache-aware" and cache_bytes is None:
        raise ValueError("The cache-aware model needs cache_bytes (the cache's size). Received: cache_bytes=None")
    number("tolerance", tolerance, above=0)
    cache = cache_bytes if model == "cache-aware" else None
    fit_set = {float(s) for s in fit_sizes}
    train = sorted(float(s) for s in measured if float(s) in fit_set)
    held = sorted(float(s) for s in measured if float(s) not in fit_set)
    link = fit_link(algorithm, n, train, [measured[s] for s in train], cache_bytes=cache)
    errors = {float(s): (predict(algorithm, n, float(s), link) - t) / t for s, t in measured.items()}
    support = fit_support(algorithm, n, train, cache_bytes=cache)
    return LinkCheck(
        model=model,
        link=link,
        fitted=ErrorSummary({s: errors[s] for s in train}, tolerance),
        held_out=ErrorSummary({s: errors[s] for s in held}, tolerance),
        single_point={p: sizes[0] for p, sizes in support.items() if len(sizes) == 1},
        held_out_support=fit_support(algorithm, n, held, cache_bytes=cache) if held else {},
    )


def verdict(name: str, checks: Mapping[str, LinkCheck | str], of_record: str, *, max_size: float | None = None
            ) -> str:
    """One line judging ``name``'s model of record on its held-out sizes up to ``max_size``.

    ``checks`` maps each model to its :class:`LinkCheck`, or to why it could not be fitted. The
    fitted sizes are reported beside, as what they are; the other model is not consulted.

    Example:
        >>> verdict("RING", {"cache-aware": "no fitted size beyond the cache"}, "cache-aware")
        'RING (cache-aware): not judged: no fitted size beyond the cache'
    """
    if of_record not in MODELS:
        raise ValueError(f"of_record must be one of {', '.join(repr(m) for m in MODELS)}. "
                         f"Received: of_record={of_record!r}")
    check = checks.get(of_record, "not fitted")
    if isinstance(check, str):
        return f"{name} ({of_record}): not judged: {check}"
    held, fitted = check.held_out.upto(max_size), check.fitted.upto(max_size)
    missed = ", ".join(f"{human_size(s)} {e:+.0%}" for s, e in held.missed.items())
    return (f"{name} ({of_record}): held-out {held.describe()}" + (f" (missed: {missed})" if missed else "")
            + f"; fitted sizes, not evidence: {fitted.within}/{fitted.count} within {fitted.tolerance:.0%}"
            + "".join(f"; {c}" for c in check.caveats()))
