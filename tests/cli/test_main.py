"""The CLI's boundary: bad input is one ``error:`` line and exit 2; a bug in tensorfleet is not."""

from __future__ import annotations

import pytest

import tensorfleet.capabilities
from tensorfleet.cli.main import REPORT_BUG, main


@pytest.mark.parametrize("bug", [TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
                                 KeyError("features"), AttributeError("'NoneType' object has no attribute 'key'")])
def test_an_internal_error_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys, bug):
    def broken() -> dict:
        raise bug

    monkeypatch.setattr(tensorfleet.capabilities, "versions", broken)
    assert main(["info"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.rstrip().splitlines()[-1] == REPORT_BUG
    assert f"{type(bug).__name__}: " in err and "error: " not in err


def test_bad_input_is_one_error_line_and_exit_2(capsys):
    assert main(["plan", "--model", "digits_cnnn", "--batch", "32", "--devices", "2", "--device-memory", "16GB",
                 "--bandwidth", "10Gbps"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: Unknown model 'digits_cnnn'. Did you mean 'digits_cnn'? Available: "
                   + err[0].split("Available: ", 1)[1]]
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize(("argv", "line"), [
    (["federated", "run", "--rounds", "2.5"], "error: Invalid value for '--rounds': Input should be a valid integer, "
                                              "unable to parse string as an integer. Received: --rounds '2.5'"),
    (["plan", "--batch=big"], "error: Invalid value for '--batch': Input should be a valid integer, unable to parse "
                              "string as an integer. Received: --batch 'big'"),
    (["federated", "run", "--backend", "gpu"], "error: Invalid value for '--backend': 'gpu' is not one of 'tff', "
                                               "'compiled', 'auto'. Received: --backend 'gpu'"),
    (["edge", "convert", "digits_cnn"], "error: Missing option '--out' / '-o'."),
    (["launch", "--wokers", "2", "train.py"], "error: No such option: --wokers. Did you mean --workers?"),
])
def test_a_command_line_that_does_not_parse_is_one_error_line_too(capsys, argv, line):
    # click's own form (a usage line, a hint, "Error: ..." and its wrapper's "Value error, ") said it in other words.
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


LAYERS = """import keras


@keras.saving.register_keras_serializable(package="tfltest")
class Scale(keras.layers.Layer):
    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}
"""


def test_import_makes_a_model_file_with_its_own_layers_loadable(tmp_path, monkeypatch, capsys, keras3):
    import sys

    from tensorfleet.cli.main import import_user_module

    (tmp_path / "layers_of_mine.py").write_text(LAYERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    mine = import_user_module(str(tmp_path / "layers_of_mine.py"))
    keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(3), mine.Scale(3.0)]).save("m.keras")
    # As in a new process: neither the module nor its registered class is known.
    keras3.saving.get_custom_objects().pop("tfltest>Scale")
    monkeypatch.delitem(sys.modules, "layers_of_mine")
    assert main(["serving", "export", "m.keras", "base"]) == 2
    assert capsys.readouterr().err == (
        f"error: tfl.serving.load_keras_model: m.keras uses 'Scale' (saved from module 'layers_of_mine'), a class of "
        f"your own that keras {keras3.__version__} cannot find. Import the module that defines it (its class "
        "registered with @keras.saving.register_keras_serializable) before the model is loaded: `import MODULE` in "
        "Python, `tensorfleet --import MODULE ...` on the command line.\n")
    try:
        assert main(["--import", "layers_of_mine", "serving", "export", "m.keras", "base"]) == 0
        assert (tmp_path / "base" / "1" / "saved_model.pb").is_file()
    finally:
        keras3.saving.get_custom_objects().pop("tfltest>Scale", None)


def test_import_errors_are_one_line_naming_the_module_and_the_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "raises.py").write_text("x = 1\ny = 1 / 0\n")
    cases = [("nosuch_module_here", f"error: --import nosuch_module_here: no module 'nosuch_module_here' on the "
                                    f"Python path or in the current folder ({tmp_path}). Give the module that defines "
                                    "the model's layers, or its .py file."),
             ("missing.py", "error: --import missing.py: no such Python file. Give a module name (my_layers) or the "
                            "path of a .py file."),
             ("raises.py", f"error: --import raises.py failed: ZeroDivisionError: division by zero "
                           f"({tmp_path / 'raises.py'}, line 2)")]
    for name, line in cases:
        assert main(["--import", name, "info"]) == 2
        assert capsys.readouterr().err == line + "\n"


@pytest.mark.slow
def test_a_module_imported_with_import_starts_tensorflow_quietly(tmp_path):
    # TensorFlow's start-up lines (oneDNN, CUDA stubs) are filtered from the first import on; --import used to run
    # before the filter and the log level were set, so a layers module that imports Keras let them all through.
    import os
    import subprocess
    import sys

    (tmp_path / "uses_tf.py").write_text("import tensorflow as tf\ntf.constant(1)\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "tensorfleet.cli.main", "--import", "uses_tf.py", "info"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("python ") and done.stderr == "", done.stderr
