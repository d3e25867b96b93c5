"""Several models behind one server: requests routed by model name to each model's own predictor.

Each model keeps its own :class:`~tensorfleet.serving.predictor.Predictor` (versions, batchers,
replicas and autoscaler), so each scales on its own and an idle one goes to zero while a busy one
keeps its replicas. The router offers the fronts what a single predictor does: ``submit``, a
``repository`` that finds a servable by model name, ``metrics`` (every model's, one Prometheus
family each) and ``ready``.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

from tensorfleet.serving.errors import Code, ServingError
from tensorfleet.serving.predictor import Prediction, Predictor
from tensorfleet.serving.repository import ModelRepository
from tensorfleet.serving.servable import Servable

__all__ = ["Front", "ModelRouter", "merge_metrics"]


def merge_metrics(texts: list[str]) -> str:
    """Prometheus texts of several models as one: each family's ``# TYPE`` line once, its samples together.

    Example:
        >>> print(merge_metrics(["# TYPE a counter\\na{m=\\"x\\"} 1\\n",
        ...                      "# TYPE a counter\\na{m=\\"y\\"} 2\\n"]), end="")
        # TYPE a counter
        a{m="x"} 1
        a{m="y"} 2
    """
    families: dict[str, list[str]] = {}
    family = ""
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                family = line
                families.setdefault(family, [])
            elif line:
                families.setdefault(family, []).append(line)
    return "".join(f"{head}\n" + "".join(f"{line}\n" for line in lines) for head, lines in families.items())


class _Repositories:
    """The servables of every model, found by model name as one repository finds its own."""

    def __init__(self, predictors: Mapping[str, Predictor]) -> None:
        self._predictors = predictors

    def _one(self, name: str) -> ModelRepository:
        predictor = self._predictors.get(name)
        if predictor is None:
            raise ServingError(f"Servable not found for request: model {name!r} is not served (this server "
                               f"serves {sorted(self._predictors)}).", Code.NOT_FOUND)
        return predictor.repository

    def get(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        return self._one(name).get(name, version, label)

    def status(self, name: str, version: int | None = None) -> list[tuple[int, str]]:
        if name not in self._predictors:
            raise ServingError(f"Could not find any versions of model {name!r}; served: {sorted(self._predictors)}.",
                               Code.NOT_FOUND)
        return self._one(name).status(name, version)

    @property
    def versions(self) -> dict[str, list[int]]:
        return {name: p.repository.versions for name, p in self._predictors.items()}


class _Metrics:
    def __init__(self, predictors: Mapping[str, Predictor]) -> None:
        self._predictors = predictors

    def observe_request(self, api: str, status: str, seconds: float, model: str | None = None) -> None:
        predictor = self._predictors.get(model or "")
        if predictor is not None:  # a request for a model not served is answered 404 and not counted
            predictor.metrics.observe_request(api, status, seconds)

    def render(self) -> str:
        return merge_metrics([p.metrics.render() for p in self._predictors.values()])


class ModelRouter:
    """The fronts' view of several predictors, one per model name.

    Example:
        >>> router = ModelRouter({"digits": digits_predictor, "wine": wine_predictor})  # doctest: +SKIP
        >>> router.submit("wine", {"x": rows}).result()                                  # doctest: +SKIP
    """

    def __init__(self, predictors: Mapping[str, Predictor]) -> None:
        self.predictors = dict(predictors)
        self.repository = _Repositories(self.predictors)
        self.metrics = _Metrics(self.predictors)

    @property
    def ready(self) -> bool:
        return all(p.ready for p in self.predictors.values())

    def submit(self, model: str, inputs: Mapping[str, Any], **options: Any) -> Prediction:
        self.repository._one(model)  # an unknown model: NOT_FOUND naming the served ones
        return self.predictors[model].submit(model, inputs, **options)


# What the gRPC and REST fronts serve: one model's predictor, or the router of several (the same methods)
Front = Union[Predictor, ModelRouter]
