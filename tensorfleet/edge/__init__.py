"""From a Keras model to a microcontroller: low-rank decomposition, TFLite conversion and quantization, validation on
the TFLite Micro interpreter, the arena and size report, and C source export.

TensorFlow is imported only inside the functions that need it, so importing this package is
cheap.

Example:
    >>> import tensorfleet as tfl
    >>> artifact = tfl.edge.convert(model, quantization="int8", representative_data=x_train)  # doctest: +SKIP
    >>> validation = tfl.edge.validate_micro(artifact, x_test, y_test)                        # doctest: +SKIP
    >>> tfl.edge.export_c(artifact, "out/", name="kws")                                      # doctest: +SKIP
"""

from __future__ import annotations

from tensorfleet.edge.artifact import TensorInfo, TFLiteArtifact, verify_int8
from tensorfleet.edge.convert import QUANTIZATIONS, Quantization, convert, load_keras_model
from tensorfleet.edge.decompose import DecompositionMethod, DecompositionPlan, LayerPlan, decompose, plan_decomposition
from tensorfleet.edge.decompose_plan import FORMS, DecompositionForm
from tensorfleet.edge.errors import (
    ArenaTooSmallError,
    DecompositionError,
    EdgeError,
    EdgeWarning,
    InvalidModelError,
    MicroIncompatibleError,
    QuantizationError,
    UnsupportedOpError,
)
from tensorfleet.edge.export import check_c_name, export_c, sanitize_c_identifier
from tensorfleet.edge.micro import (
    MAX_ARENA_BYTES,
    MicroValidation,
    check_micro_compatible,
    find_arena_size,
    validate_micro,
)
from tensorfleet.edge.optimize import (
    TECHNIQUES,
    Technique,
    distill,
    finetune,
    freeze_layers,
    unique_weights,
    weight_sparsity,
)
from tensorfleet.edge.report import BOARDS, Board, EdgeReport, report

__all__ = [
    "TFLiteArtifact", "TensorInfo", "verify_int8",
    "QUANTIZATIONS", "Quantization", "convert", "load_keras_model",
    "DecompositionPlan", "LayerPlan", "DecompositionMethod", "decompose", "plan_decomposition", "FORMS",
    "DecompositionForm",
    "ArenaTooSmallError", "DecompositionError", "EdgeError", "EdgeWarning", "InvalidModelError",
    "MicroIncompatibleError",
    "QuantizationError", "UnsupportedOpError",
    "check_c_name", "export_c", "sanitize_c_identifier",
    "MAX_ARENA_BYTES", "MicroValidation", "check_micro_compatible", "find_arena_size", "validate_micro",
    "TECHNIQUES", "Technique", "distill", "finetune", "freeze_layers", "unique_weights", "weight_sparsity",
    "BOARDS", "Board", "EdgeReport", "report",
]
