"""Makes ``docs/hooks`` importable while the site builds (mkdocs-click loads ``cli_command`` from it)."""

from __future__ import annotations

import sys
from pathlib import Path

HOOKS = str(Path(__file__).resolve().parent)


def on_config(config):
    """Puts this folder on ``sys.path`` (mkdocs restores the path after loading a hook)."""
    if HOOKS not in sys.path:
        sys.path.insert(0, HOOKS)
    return config
