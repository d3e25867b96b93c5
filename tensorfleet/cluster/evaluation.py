"""The side-car evaluator: a task that evaluates each checkpoint the chief writes while it trains.

TensorFlow's own ``tf.keras.utils.SidecarEvaluator`` does the watching, restoring and evaluating;
this module adds what a job needs around it, in one call the same script makes in every role:

* :func:`evaluation` returns False at once in a training task; in the ``evaluator`` task of
  TF_CONFIG (or when asked to) it evaluates checkpoints until training has ended and its last
  checkpoint is evaluated, then returns True and the script exits. Training has ended when the
  launcher says so (it creates the file named by ``TENSORFLEET_TRAINING_ENDED`` once every
  trainer has finished, and waits for the evaluator) or, without a launcher, after checkpoint
  ``last_checkpoint``;
* per checkpoint: TensorBoard summaries (``OUT/tensorboard``, Keras' ``evaluation_<metric>_vs_iterations``),
  a row of ``OUT/evaluation.csv`` (checkpoint, training step, every metric), and
  ``OUT/best.keras`` replaced when the metric ``monitor`` improves; every file is written atomically;
* a restarted evaluator reads its CSV and skips the checkpoints it already evaluated (the first
  checkpoint ``SidecarEvaluator`` restores is the newest, which a killed evaluator may have done).

The trainer writes the checkpoints with :func:`checkpoint_callback` (Keras' ``ModelCheckpoint``
with weights only, ``ckpt-<epoch>``, the flow ``SidecarEvaluator`` documents), from the chief only.

A Keras 3 model (``model_fn`` returns one; the trainer's callback is ``checkpoint_callback(dir,
keras="keras3")``, the default in a process where ``tf.keras`` is Keras 3): Keras 3 has no
``SidecarEvaluator`` and its ``ModelCheckpoint`` writes ``.weights.h5`` files only, which
TensorFlow's checkpoint watching cannot see. The callback writes the model and its optimizer as a
TensorFlow checkpoint ``ckpt-<epoch>`` instead (``tf.train.CheckpointManager``), and the evaluator
runs the same loop ``SidecarEvaluator`` does (``tf.train.checkpoints_iterator``, restore, evaluate)
with Keras 3's own callbacks; what it writes is the same.

Example (a training script; ``tensorfleet launch --evaluator`` runs the same file in the evaluator
task, which stops once training has ended, however many epochs early stopping left):
    >>> from tensorfleet.cluster import evaluation as ev
    >>> if ev.evaluation(build_model, (x_val, y_val), checkpoint_dir="ckpt", out_dir="eval",
    ...                  monitor="accuracy"):                                       # doctest: +SKIP
    ...     raise SystemExit(0)
    >>> model.fit(x, y, epochs=50, callbacks=[ev.checkpoint_callback("ckpt"),
    ...                                       tf.keras.callbacks.EarlyStopping()])  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from tensorfleet.cluster.contract import ENV_TRAINING_ENDED
from tensorfleet.compat import distribute as tf_internals
from tensorfleet.compat.keras import Keras, as_keras, is_keras3_model, keras2, keras3, module_of
from tensorfleet.io import write_bytes, write_text
from tensorfleet.validation import integer, renamed

__all__ = ["CSV_FILE", "BEST_MODEL", "checkpoint_callback", "evaluated_checkpoints", "evaluation", "export_model",
           "is_evaluator", "training_ended"]

CSV_FILE = "evaluation.csv"
BEST_MODEL = "best.keras"
_NUMBER = re.compile(r"-(\d+)$")
_STEP_KEY = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
# Seconds SidecarEvaluator waits without a new checkpoint before it asks whether to stop (its own
# wait is 30 s); TensorFlow looks for a new checkpoint every second meanwhile.
_ASK_EVERY = 2


def is_evaluator(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is the ``evaluator`` task of its TF_CONFIG."""
    text = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    return bool(text) and json.loads(text).get("task", {}).get("type") == "evaluator"


def training_ended(environ: dict[str, str] | None = None) -> bool:
    """Whether the launcher has said that every trainer of this job has finished."""
    path = (os.environ if environ is None else environ).get(ENV_TRAINING_ENDED, "")
    return bool(path) and os.path.exists(path)


def checkpoint_callback(checkpoint_dir: str | os.PathLike[str], keras: Keras | str | Any = None) -> Any:
    """A callback that saves the model's weights (and the optimizer's step) as ``ckpt-<epoch>`` every epoch,
    which :func:`evaluation` watches for.

    Args:
        checkpoint_dir: where the checkpoints go.
        keras: the Keras of the model that trains: the model itself, ``"keras3"`` or ``"keras2"``; None: the
            Keras ``tf.keras`` is in this process. Keras 2: Keras' ``ModelCheckpoint`` with weights only; Keras 3:
            a TensorFlow checkpoint of the model and its optimizer (Keras 3's ``ModelCheckpoint`` writes
            ``.weights.h5``).
    """
    directory = os.fspath(checkpoint_dir)
    if as_keras(keras, "checkpoint_callback") is Keras.KERAS2:
        return keras2().callbacks.ModelCheckpoint(os.path.join(directory, "ckpt-{epoch}"), save_weights_only=True)

    callback: Any = keras3().callbacks.Callback  # a base read at run time: Any to the type checker

    class TensorFlowCheckpoint(callback):
        """Writes ``ckpt-<epoch>`` (1-based, as ``ModelCheckpoint`` numbers them) and names it newest. Under a
        multi-worker strategy every worker saves (reading mirrored variables is a collective), the chief into
        ``checkpoint_dir`` and the others into a scratch folder of their own, removed when training ends."""

        scratch: str | None = None

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            import tempfile

            import tensorflow as tf

            chief = self.model.distribute_strategy.extended.should_checkpoint
            self.scratch = None if chief else tempfile.mkdtemp(prefix="tensorfleet-ckpt-")
            checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer)
            self.manager = tf.train.CheckpointManager(checkpoint, self.scratch or directory,
                                                      max_to_keep=1 if self.scratch else None, checkpoint_name="ckpt")

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.manager.save(checkpoint_number=epoch + 1)

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            if self.scratch:
                import shutil

                shutil.rmtree(self.scratch, ignore_errors=True)

    return TensorFlowCheckpoint()


@renamed(out="out_dir")
def evaluated_checkpoints(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of ``OUT/evaluation.csv`` (numbers as floats, checkpoint and step as ints)."""
    path = Path(out_dir) / CSV_FILE
    if not path.exists():
        return []
    rows = list(csv.DictReader(path.read_text().splitlines()))
    return [{k: int(v) if k in ("checkpoint", "step") else float(v) for k, v in row.items()} for row in rows]


class _Recorder:
    """The callback that records each evaluation (CSV row, best model) and the evaluate hook that
    skips checkpoints already recorded."""

    def __init__(self, model: Any, checkpoint_dir: Path, out: Path, monitor: str, mode: str,
                 log: Callable[[str], None]) -> None:
        self.model, self.checkpoint_dir, self.out = model, checkpoint_dir, out
        self.monitor, self.mode, self.log = monitor, mode, log
        self.rows = evaluated_checkpoints(out)
        self.done = {row["checkpoint"] for row in self.rows}
        self.current: int | None = None

    def checkpoint_number(self) -> int:
        """The number of the checkpoint just restored: the one whose training step is the model's
        (the newest may already be a later one), found among ``ckpt-<n>`` from the newest down."""
        import tensorflow as tf

        step = int(self.model.optimizer.iterations.numpy()) if self.model.optimizer is not None else None
        numbers = sorted((int(m.group(1)) for p in self.checkpoint_dir.glob("ckpt-*.index")
                          if (m := _NUMBER.search(p.name.removesuffix(".index")))), reverse=True)
        for number in numbers:
            try:
                if step is None or int(tf.train.load_variable(str(self.checkpoint_dir / f"ckpt-{number}"),
                                                              _STEP_KEY)) == step:
                    return number
            except (tf.errors.OpError, ValueError):  # being written, or removed meanwhile
                continue
        return numbers[0] if numbers else -1

    def newest(self) -> int | None:
        """The number of the newest complete checkpoint (the one TensorFlow's state file names)."""
        import tensorflow as tf

        path = tf.train.latest_checkpoint(str(self.checkpoint_dir))
        match = _NUMBER.search(path) if path else None
        return int(match.group(1)) if match else None

    def finished(self) -> bool:
        """Training has ended and its newest checkpoint is evaluated (or it wrote none)."""
        if not training_ended():
            return False
        newest = self.newest()
        return newest is None or newest in self.done

    def hook(self, evaluate: Callable[..., Any]) -> Callable[..., Any]:
        def evaluate_new(*args: Any, **kwargs: Any) -> Any:
            self.current = self.checkpoint_number()
            if self.current in self.done:
                self.log(f"checkpoint {self.current} was evaluated before this evaluator restarted; skipped")
                return None
            # SidecarEvaluator asks for Keras' verbose=2 line; record() prints the same numbers once.
            return evaluate(*args, **{**kwargs, "verbose": 0})

        return evaluate_new

    def record(self, logs: dict[str, Any]) -> None:
        step = int(self.model.optimizer.iterations.numpy()) if self.model.optimizer is not None else -1
        row = {"checkpoint": self.current, "step": step, **{k: float(v) for k, v in logs.items()}}
        value, best = row.get(self.monitor), self.best()
        if value is None:
            raise ValueError(f"monitor {self.monitor!r} is not a metric the evaluation reports; it reports: "
                             f"{', '.join(sorted(logs))}. Received: monitor={self.monitor!r}")
        better = best is None or (value > best if self.mode == "max" else value < best)
        if better:  # before the row: an evaluator killed in between evaluates this checkpoint again on restart
            export_model(self.model, self.out / BEST_MODEL)
        self.rows.append(row)
        self.done.add(self.current)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(row), lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_text(self.out / CSV_FILE, buffer.getvalue())
        self.log(f"checkpoint {self.current} (step {step}): "
                 + ", ".join(f"{k}={v:.4f}" for k, v in logs.items()) + (" (best so far)" if better else ""))

    def best(self) -> float | None:
        values = [r[self.monitor] for r in self.rows if self.monitor in r]
        return (max if self.mode == "max" else min)(values) if values else None


def export_model(model: Any, path: str | os.PathLike[str]) -> Path:
    """Saves ``model`` in the Keras format at ``path``, atomically (Keras writes the file by name,
    so it is written to a scratch directory first and its bytes renamed into place).

    A model restored from weights has an optimizer whose slots were never made; saved so, loading
    it warns "Skipping variable loading for optimizer". Its slots are made first (restored from the
    checkpoint where it holds them, else zeros), so the file loads quietly, ready to train on.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and callable(getattr(optimizer, "build", None)):
        optimizer.build(model.trainable_variables)
    with tempfile.TemporaryDirectory(prefix="tensorfleet-model-") as scratch:
        tmp = Path(scratch) / "model.keras"
        model.save(tmp)
        return write_bytes(Path(path), tmp.read_bytes())


@renamed(out="out_dir")
def evaluation(model_fn: Callable[[], Any], data: Any, *, checkpoint_dir: str | os.PathLike[str],
               out_dir: str | os.PathLike[str], monitor: str = "accuracy", mode: str = "max",
               last_checkpoint: int | None = None, steps: int | None = None, force: bool = False,
               log: Callable[[str], None] = print) -> bool:
    """Runs the side-car evaluation in the evaluator task (or with ``force``); False elsewhere.

    Args:
        model_fn: builds and compiles the model the trainer checkpoints (with its metrics).
        data: what ``model.evaluate`` takes as ``x``: a dataset, or ``(x, y)`` arrays.
        checkpoint_dir: where the chief writes ``ckpt-<n>`` (:func:`checkpoint_callback`).
        out_dir: where the summaries, ``evaluation.csv`` and ``best.keras`` go.
        monitor, mode: the metric that decides the best model, and whether larger (``max``) or
            smaller (``min``) is better.
        last_checkpoint: the number of the last checkpoint (the epochs, with one per epoch):
            the evaluator stops after it. None: it stops once the launcher says training has
            ended and the newest checkpoint is evaluated (under ``tensorfleet launch``, the way
            to use it; a process of your own stops when the file named by
            ``TENSORFLEET_TRAINING_ENDED`` exists).
        steps: evaluation steps per checkpoint (needed for a repeating dataset).
        force: evaluate even outside an evaluator task (for a separate evaluation process).

    Returns:
        True after evaluating (the script should exit), False when this process trains.

    Raises:
        TypeError: ``model_fn`` did not return a Keras model.
    """
    if not (force or is_evaluator()):
        return False
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min'. Received: mode={mode!r}")
    integer("last_checkpoint", last_checkpoint, minimum=1, optional=True)
    import tensorflow as tf

    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    model = model_fn()
    keras: Any = module_of(model, "tensorfleet.cluster.evaluation.evaluation (the model model_fn built)")
    recorder = _Recorder(model, Path(checkpoint_dir), out_path, monitor, mode, log)
    model.evaluate = recorder.hook(model.evaluate)

    callback: Any = keras.callbacks.Callback

    class _Record(callback):
        def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
            recorder.record(dict(logs or {}))

    x, y = (data if isinstance(data, tuple) and len(data) == 2 else (data, None))
    dataset = x if y is None else tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    callbacks = [keras.callbacks.TensorBoard(str(out_path / "tensorboard")), _Record()]
    if last_checkpoint is not None and last_checkpoint in recorder.done:
        log(f"checkpoint {last_checkpoint}, the last, was evaluated before; nothing to do")
        return True
    if not recorder.finished():
        if is_keras3_model(model):
            _evaluate_checkpoints(model, dataset, Path(checkpoint_dir), steps, last_checkpoint, callbacks,
                                  recorder.finished)
        else:
            evaluator = tf_internals.sidecar_evaluator_class(stop=recorder.finished)(
                model, dataset, str(checkpoint_dir), steps=steps, max_evaluations=last_checkpoint, callbacks=callbacks)
            with tf_internals.sidecar_checkpoint_wait(_ASK_EVERY):
                evaluator.start()
    if training_ended():
        newest = recorder.newest()
        log("training ended without writing a checkpoint; nothing to evaluate" if newest is None else
            f"training ended and its last checkpoint, {newest}, is evaluated; the evaluator stops")
    return True


def _evaluate_checkpoints(model: Any, data: Any, checkpoint_dir: Path, steps: int | None,
                          last_checkpoint: int | None, callbacks: list[Any], finished: Callable[[], bool]) -> None:
    """``SidecarEvaluator.start`` for a Keras 3 model (Keras 3 has none): each new checkpoint restored into the
    model and its optimizer and evaluated, until ``finished()`` says no new one will come, or after checkpoint
    ``last_checkpoint``."""
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    for path in tf.train.checkpoints_iterator(str(checkpoint_dir), timeout=_ASK_EVERY, timeout_fn=finished):
        try:
            checkpoint.restore(path).expect_partial()
        except tf.errors.OpError:  # being written or removed as it was read: the next one comes
            continue
        model.evaluate(data, steps=steps, callbacks=callbacks, verbose=0)
        match = _NUMBER.search(path)
        if last_checkpoint is not None and match and int(match.group(1)) >= last_checkpoint:
            return
