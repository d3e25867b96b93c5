"""The ``compiled`` backend: federated rounds as compiled TensorFlow functions of tensorfleet's own, outside TFF.

* :mod:`~tensorfleet.federated.backends.compiled.engine`: :class:`CompiledFedAvg`, a round as one traced
  function composed from the registries' parts (client work, aggregator, server optimizer);
* :mod:`~tensorfleet.federated.backends.compiled.client`: one client's local steps in its lane;
* :mod:`~tensorfleet.federated.backends.compiled.layout`: the round's shape, lanes and flat weights;
* :mod:`~tensorfleet.federated.backends.compiled.local`: FedBN's per-client BatchNormalization layers;
* :mod:`~tensorfleet.federated.backends.compiled.evaluate`: federated evaluation and the server's weights;
* :mod:`~tensorfleet.federated.backends.compiled.scope`: what the backend runs, and what it refuses.

Why an engine of its own: docs/explanation-federated-engine.md.
"""

from tensorfleet.federated.backends.compiled.engine import CompiledFedAvg
from tensorfleet.federated.backends.compiled.layout import NonTrainable, RoundShape, default_lanes
from tensorfleet.federated.backends.compiled.scope import (
    batch_dependent_layers,
    compiled_aggregators,
    compiled_algorithms,
    compiled_refusal,
    runs_compiled,
    unsupported,
)

__all__ = ["CompiledFedAvg", "NonTrainable", "RoundShape", "batch_dependent_layers", "compiled_aggregators",
           "compiled_algorithms", "compiled_refusal", "default_lanes", "runs_compiled", "unsupported"]
