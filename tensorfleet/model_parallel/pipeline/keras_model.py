"""The Keras front of a pipeline: a Keras model (of the pipeline model's Keras) whose ``fit`` trains through it.

Built by :meth:`Pipeline.keras_model() <tensorfleet.model_parallel.pipeline.Pipeline.keras_model>`;
its ``train_step`` is one pipeline step, so Keras' progress bar, callbacks and history work as
usual, with the step's ``bubble_fraction`` recorded beside the loss.
"""

from __future__ import annotations

from typing import Any

from tensorfleet.compat.keras import module_of

__all__ = ["pipeline_keras_model"]


def pipeline_keras_model(pipeline: Any) -> Any:
    """A ``tf.keras.Model`` named ``<model>_pipeline`` that trains ``pipeline``'s model through it.

    Compile it with ``run_eagerly=True``; ``predict`` and ``evaluate`` use the unsplit model.
    """
    import tensorflow as tf

    keras: Any = module_of(pipeline.model, "Pipeline.keras_model")  # the model's own Keras: 3 or tf_keras

    class PipelineModel(keras.Model):
        """Keras front of a :class:`Pipeline`: ``train_step`` is one pipeline step."""

        def __init__(self) -> None:
            super().__init__(name=f"{pipeline.model.name}_pipeline")
            self.pipeline = pipeline
            self.inner = pipeline.model
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.bubble_tracker = keras.metrics.Mean(name="bubble_fraction")

        def call(self, inputs: Any, training: Any = None) -> Any:
            return self.inner(inputs, training=training)

        @property
        def metrics(self) -> list[Any]:
            return [self.loss_tracker, self.bubble_tracker]

        def train_step(self, data: Any) -> dict[str, Any]:
            if tf.executing_eagerly() is False:
                raise RuntimeError("A pipeline model trains eagerly: compile it with run_eagerly=True.")
            x, y = data[0], data[1]
            step = self.pipeline.train_step(x, y, self.optimizer)
            self.loss_tracker.update_state(step.loss)
            self.bubble_tracker.update_state(step.bubble_fraction)
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data: Any) -> dict[str, Any]:
            x, y = data[0], data[1]
            self.loss_tracker.update_state(self.pipeline.loss(y, self.inner(x, training=False)))
            return {"loss": self.loss_tracker.result()}

    return PipelineModel()
