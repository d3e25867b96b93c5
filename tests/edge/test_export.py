"""C export: TFLM's naming and alignment, compiled with g++ and compared byte for byte."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tensorfleet import edge
from tensorfleet.edge.export import op_resolver_source
from tensorfleet.edge.ops import MICRO_CUSTOM_OPS, MICRO_OPS

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")

HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include "kws_model_data.h"

// Writes the exported array back out so the test can compare it with the .tflite file.
int main(int argc, char** argv) {
  if (reinterpret_cast<std::uintptr_t>(g_kws_model_data) % 16 != 0) return 3;
  if (kKwsTensorArenaSize != ARENA) return 4;
  std::FILE* out = std::fopen(argv[1], "wb");
  if (out == nullptr) return 2;
  std::fwrite(g_kws_model_data, 1, g_kws_model_data_len, out);
  return std::fclose(out) == 0 ? 0 : 5;
}
"""


def _resolver_stand_in() -> str:
    """A declaration-level stand-in for TFLM's micro_mutable_op_resolver.h.

    The TFLM C++ sources are not installed here, so the generated resolver is compiled against
    this header: it has TFLM's class template and Add* method names (from tensorfleet's op
    table), and counts registrations the way TFLM does (more than N is an error).
    """
    methods = "\n".join(f"  TfLiteStatus {m}() {{ return Add(\"{m}\"); }}"
                        for m in sorted(set(MICRO_OPS.values()) | set(MICRO_CUSTOM_OPS.values())))
    return f"""
#pragma once
#include <cstdio>
typedef enum {{ kTfLiteOk = 0, kTfLiteError = 1 }} TfLiteStatus;
namespace tflite {{
template <unsigned int tOpCount>
class MicroMutableOpResolver {{
 public:
{methods}
  unsigned int GetRegistrationLength() const {{ return len_; }}
  const char* names_[tOpCount + 1];
 private:
  TfLiteStatus Add(const char* name) {{
    if (len_ >= tOpCount) return kTfLiteError;
    names_[len_++] = name;
    return kTfLiteOk;
  }}
  unsigned int len_ = 0;
}};
}}  // namespace tflite
"""


def test_name_is_sanitised_to_a_c_identifier() -> None:
    assert edge.sanitize_c_identifier("kws") == "kws"
    assert edge.sanitize_c_identifier("kws-model v2") == "kws_model_v2"
    assert edge.sanitize_c_identifier("  9lives!") == "model_9lives"
    assert edge.sanitize_c_identifier("int") == "int_model"
    assert edge.sanitize_c_identifier("Ünïcode.tflite") == "n_code_tflite"
    with pytest.raises(ValueError, match=r"must contain a letter or digit .* Received: name='--'"):
        edge.sanitize_c_identifier("--")


def test_files_follow_tflm_conventions(int8_artifact: Any, tmp_path: Path) -> None:
    paths = edge.export_c(int8_artifact, tmp_path, "kws", arena_bytes=5488)
    assert [p.name for p in paths] == ["kws_model_data.h", "kws_model_data.cc", "kws_op_resolver.h"]
    header, source, resolver = (p.read_text() for p in paths)
    assert "extern const unsigned char g_kws_model_data[];" in header
    assert "extern const unsigned int g_kws_model_data_len;" in header
    assert "constexpr unsigned int kKwsTensorArenaSize = 5488;" in header
    assert ("// Tensor arena for this model: the smallest with which the TFLite Micro Python interpreter\n"
            "// runs it (measured). That interpreter's RecordingMicroAllocator keeps its records in the\n"
            "// arena; with the plain MicroAllocator this firmware needs a little less (240-424 bytes\n") in header
    assert "alignas(16) const unsigned char g_kws_model_data[] = {" in source
    assert f"const unsigned int g_kws_model_data_len = {int8_artifact.size};" in source
    assert "using KwsOpResolver = tflite::MicroMutableOpResolver<4>;" in resolver
    assert [line.split("resolver.")[1].split("(")[0] for line in resolver.splitlines() if "resolver.Add" in line] == [
        "AddConv2D", "AddFullyConnected", "AddMaxPool2D", "AddReshape"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)  # no temporaries


@needs_gxx
@pytest.mark.slow
def test_compiled_array_is_byte_identical_to_the_tflite(int8_artifact: Any, tmp_path: Path) -> None:
    edge.export_c(int8_artifact, tmp_path, "kws", arena_bytes=5488)
    (tmp_path / "harness.cc").write_text(HARNESS)
    exe = tmp_path / "harness"
    subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror", "-DARENA=5488", "-I", str(tmp_path),
                    str(tmp_path / "harness.cc"), str(tmp_path / "kws_model_data.cc"), "-o", str(exe)],
                   check=True, capture_output=True, timeout=120)
    written = tmp_path / "roundtrip.tflite"
    result = subprocess.run([str(exe), str(written)], capture_output=True, timeout=30)
    assert result.returncode == 0, result
    assert written.read_bytes() == int8_artifact.data


@needs_gxx
@pytest.mark.slow
def test_generated_resolver_compiles_and_registers_exactly_the_models_ops(int8_artifact: Any,
                                                                         tmp_path: Path) -> None:
    include = tmp_path / "include" / "tensorflow" / "lite" / "micro"
    include.mkdir(parents=True)
    (include / "micro_mutable_op_resolver.h").write_text(_resolver_stand_in())
    edge.export_c(int8_artifact, tmp_path, "kws")
    (tmp_path / "main.cc").write_text(r"""
#include <cstdio>
#include "kws_op_resolver.h"
int main() {
  KwsOpResolver resolver;
  if (RegisterKwsOps(resolver) != kTfLiteOk) return 1;
  for (unsigned int i = 0; i < resolver.GetRegistrationLength(); ++i) std::printf("%s\n", resolver.names_[i]);
  return 0;
}
""")
    exe = tmp_path / "main"
    subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror", "-I", str(tmp_path / "include"), "-I", str(tmp_path),
                    str(tmp_path / "main.cc"), "-o", str(exe)], check=True, capture_output=True, timeout=120)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout.split() == ["AddConv2D", "AddFullyConnected", "AddMaxPool2D", "AddReshape"]


def test_export_of_a_model_with_an_op_tflm_lacks_writes_nothing(topk_artifact: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(edge.UnsupportedOpError, match=r"Cannot generate an op resolver: TFLite Micro has no "
                                                       r"kernel for TOPK_V2"):
        edge.export_c(topk_artifact, out, "topk")
    assert not out.exists()


def test_export_bad_arguments(int8_artifact: Any, tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"out_dir must be a directory. Received: out_dir='.*file' \(a file\)"):
        edge.export_c(int8_artifact, a_file, "kws")
    with pytest.raises(ValueError,
                       match=r"arena_bytes must be an integer from 1 to 67108864. Received: arena_bytes=-1"):
        edge.export_c(int8_artifact, tmp_path, "kws", arena_bytes=-1)
    with pytest.raises(ValueError, match=r"from 1 to 67108864. Received: arena_bytes=4294967296"):
        edge.export_c(int8_artifact, tmp_path, "kws", arena_bytes=2**32)  # would overflow the unsigned int constant
    for name, reason in [("kws-v2", "'-' is not allowed"), ("9lives", "it starts with '9'"),
                         ("kws__v2", "'__' and a trailing '_' are reserved"), ("", "it is empty")]:
        with pytest.raises(ValueError, match=rf"; {re.escape(reason)}.* Received: name='{name}'"):
            edge.export_c(int8_artifact, tmp_path / "c", name)
    assert not (tmp_path / "c").exists()
    with pytest.raises(TypeError, match="name must be a string. Received: 3"):
        edge.export_c(int8_artifact, tmp_path, 3)  # type: ignore[arg-type]


def test_resolver_for_the_sine_model_has_one_op(sine_path: Path) -> None:
    text = op_resolver_source(edge.TFLiteArtifact.from_file(sine_path), "sine")
    assert "tflite::MicroMutableOpResolver<1>" in text and "resolver.AddFullyConnected()" in text
