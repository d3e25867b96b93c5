"""Saved Keras model files: which Keras wrote one (:func:`saved_keras`) and loading it with that Keras
(:func:`load_model`), with one error naming the file for whatever cannot be read: a damaged archive, a Keras
not installed, a class of the user's own that is not imported (it names the class and ``--import``).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

from tensorfleet.compat.keras import Keras, KerasFileError, keras2, keras_module

__all__ = ["load_model", "saved_keras"]


def saved_keras(path: str | os.PathLike[str]) -> Keras:
    """Which Keras wrote the saved model at ``path``: a ``.keras`` archive records it in ``metadata.json``
    (``keras_version``), an ``.h5`` file in its root attribute ``keras_version``.

    Raises:
        KerasFileError: ``path`` is not a readable ``.keras`` or ``.h5`` file, or records no version.
    """
    path = Path(path)
    version = _saved_version(path)
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        raise KerasFileError(f"{path} records keras_version {version!r}, which is not a version number") from None
    return Keras.KERAS3 if major >= 3 else Keras.KERAS2


def _saved_version(path: Path) -> str:
    if not path.is_file():
        raise KerasFileError(f"No Keras model file at {path} ({'a folder' if path.is_dir() else 'nothing there'}); "
                             "expected a .keras or .h5 file")
    size = path.stat().st_size
    if size == 0:
        raise KerasFileError(f"{path} is empty (0 bytes); expected a .keras or .h5 model file")
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head.startswith(b"PK") and not zipfile.is_zipfile(path):  # a zip whose end (its directory) is missing
        raise KerasFileError(f"{path} starts as a zip archive but its end is missing or damaged ({size:,} bytes: "
                             "truncated?); expected a whole .keras model file")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                metadata = json.loads(archive.read("metadata.json"))
            return str(metadata["keras_version"])
        except (KeyError, ValueError, zipfile.BadZipFile, OSError) as error:
            raise KerasFileError(f"{path} is a zip archive but not a readable .keras model: its metadata.json "
                                 f"is missing or damaged ({type(error).__name__}: {error})") from None
    if head == b"\x89HDF\r\n\x1a\n":
        import h5py

        try:
            with h5py.File(path, "r") as h5:
                version = h5.attrs.get("keras_version")
        except OSError as error:
            raise KerasFileError(f"{path} is an HDF5 file that cannot be read ({error})") from None
        if version is None:
            raise KerasFileError(f"{path} is an HDF5 file without a Keras model (no keras_version attribute)")
        return version.decode() if isinstance(version, bytes) else str(version)
    kind = " (a TFLite flatbuffer, which tensorfleet edge validate/report/export read)" if head[4:8] == b"TFL3" else ""
    raise KerasFileError(f"{path} is neither a .keras archive (zip) nor an .h5 model (HDF5): its first bytes are "
                         f"{head!r}{kind}")


def load_model(path: str | os.PathLike[str], *, compile: bool = True, where: str = "tensorfleet") -> Any:  # noqa: A002
    """The model saved at ``path``, loaded by the Keras that wrote it (:func:`saved_keras`); a SavedModel folder
    (tf_keras ``model.save(folder)``) by tf_keras, the one Keras that reads a SavedModel back as a model.

    Raises:
        KerasFileError: the file is damaged, or its Keras is not installed here, or the folder holds no Keras model
            (a SavedModel of Keras 3's ``model.export()`` or ``tf.saved_model.save``); the message names the path.
    """
    if Path(path).is_dir():
        return _load_folder(Path(path), compile=compile, where=where)
    which = saved_keras(path)
    archive = zipfile.is_zipfile(path)
    if archive != (Path(path).suffix == ".keras"):  # both Kerases pick the reader by the suffix
        raise KerasFileError(f"{where}: {path} is {'a .keras archive (zip)' if archive else 'an .h5 model (HDF5)'} "
                             f"but its name ends in {Path(path).suffix!r}; rename it to "
                             f"{Path(path).with_suffix('.keras' if archive else '.h5').name!r}")
    try:
        module = keras_module(which)
    except ImportError as error:
        raise KerasFileError(f"{where}: {path} was saved by {which.value}, which is not installed here: {error}") \
            from None
    try:
        return module.models.load_model(str(path), compile=compile)
    except Exception as error:  # any Keras deserialization failure is a problem with the file
        missing = _missing_class(str(error))
        if missing is not None:
            raise KerasFileError(f"{where}: {path} uses {missing}, a class of your own that {module.__name__} "
                                 f"{module.__version__} cannot find. Import the module that defines it (its class "
                                 "registered with @keras.saving.register_keras_serializable) before the model is "
                                 "loaded: `import MODULE` in Python, `tensorfleet --import MODULE ...` on the "
                                 "command line.") from None
        raise KerasFileError(f"{where}: {path} (saved by {which.value}) could not be loaded by "
                             f"{module.__name__} {module.__version__}: {type(error).__name__}: {error}") from None


def _missing_class(message: str) -> str | None:
    """``"'Scale' (saved from module 'my_layers')"`` when a Keras load failed on a class it cannot find, else None.
    Keras 3 says "Could not locate class 'Scale'" and dumps the configs; tf_keras "Unknown layer: 'Scale'"."""
    found = re.search(r"Could not locate (?:class|function) '([^']+)'", message) or \
        re.search(r"Cannot deserialize object of type `([^`]+)`", message) or \
        re.search(r"Unknown (?:layer|object|activation|loss|metric|initializer|regularizer|constraint)"
                  r"(?: class)?: '?([A-Za-z_][\w.>]*)'?", message)
    if found is None:
        return None
    name = found.group(1)
    origin = re.search(r"'module': '([^']+)', 'class_name': '" + re.escape(name) + "'", message)
    return f"'{name}'" + (f" (saved from module '{origin.group(1)}')" if origin and
                          not origin.group(1).startswith("keras") else "")


def _load_folder(path: Path, *, compile: bool, where: str) -> Any:  # noqa: A002
    if not (path / "saved_model.pb").is_file() and not (path / "saved_model.pbtxt").is_file():
        raise KerasFileError(f"{where}: {path} is a folder without a SavedModel (no saved_model.pb); expected a "
                             ".keras or .h5 file, or the folder of a tf_keras model.save()")
    module = keras2()
    try:
        model = module.models.load_model(str(path), compile=compile)
    except Exception as error:  # whatever tf_keras cannot read in the folder is a problem with the folder
        first = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
        raise KerasFileError(f"{where}: {path} is a SavedModel folder that tf_keras cannot load as a Keras model "
                             f"({type(error).__name__}: {first}); expected a .keras or .h5 file, or the folder of "
                             "a tf_keras model.save()") from None
    if not isinstance(model, module.Model):
        raise KerasFileError(f"{where}: {path} is a SavedModel without a Keras model (written by Keras 3's "
                             "model.export() or tf.saved_model.save: functions only); expected a .keras or .h5 "
                             "file, or the folder of a tf_keras model.save()")
    return model
