"""TF Serving's ``--model_config_file``: its text-format ``ModelServerConfig``, read into plain entries.

Each ``config`` of its ``model_config_list`` names a model, its base path (a relative one is taken
from the config file's directory) and optionally a ``model_version_policy`` (``latest`` with
``num_versions``, ``all``, ``specific`` with ``versions``) and ``version_labels``.

Example config::

    model_config_list {
      config { name: "digits" base_path: "models/digits" model_platform: "tensorflow" }
      config {
        name: "wine" base_path: "/srv/models/wine"
        model_version_policy { specific { versions: 1 versions: 2 } }
        version_labels { key: "stable" value: 1 }
      }
    }
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ModelEntry", "read_model_config"]


@dataclass(frozen=True)
class ModelEntry:
    """One model of the config: its name, base path, version policy and labels."""

    name: str
    base_path: Path
    policy: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()
    labels: dict[str, int] = field(default_factory=dict)


def _entry(config: object, where: Path) -> ModelEntry:
    name, base = config.name, config.base_path  # type: ignore[attr-defined]
    if not name or not base:
        raise ValueError(f"{where}: every config needs a name and a base_path. Received: name={name!r}, "
                         f"base_path={base!r}")
    if config.model_platform not in ("", "tensorflow"):  # type: ignore[attr-defined]
        raise ValueError(f"{where}: model {name!r}: only model_platform \"tensorflow\" is served. Received: "
                         f"{config.model_platform!r}")  # type: ignore[attr-defined]
    path = Path(base) if os.path.isabs(base) else where.parent / base
    policy = config.model_version_policy  # type: ignore[attr-defined]
    kind = policy.WhichOneof("policy_choice") or "latest"
    num_versions = policy.latest.num_versions or 1 if kind == "latest" else 1
    versions = tuple(policy.specific.versions) if kind == "specific" else ()
    return ModelEntry(name, path, kind, num_versions, versions, dict(config.version_labels))  # type: ignore


def read_model_config(path: str | os.PathLike[str]) -> list[ModelEntry]:
    """The models of a text-format ModelServerConfig file, in its order; one clear error if it is wrong."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tensorfleet.io import read_text

    where = Path(path)
    text = read_text(where, "a text-format ModelServerConfig (a model config file)")
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ValueError(f"{where} is not a text-format ModelServerConfig: {exc}") from None
    if config.WhichOneof("config") != "model_config_list" or not config.model_config_list.config:
        raise ValueError(f"{where} lists no model: expected model_config_list {{ config {{ name: ... "
                         "base_path: ... } }")
    entries = [_entry(c, where) for c in config.model_config_list.config]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: model names must differ. Received: {names}")
    return entries
