"""A griffe extension: the package's docstrings, written for Sphinx and doctest, read as Markdown.

- ``code`` (reStructuredText's literal) becomes `code`, and :func:`name` (any role) becomes `name`;
- a run of doctest lines (``>>>``, its ``...`` continuations and the output under them, up to a
  blank line) becomes a fenced ``pycon`` block, so ``d["spec"][0]`` is code, not a Markdown link.

The docstrings themselves are unchanged: this runs on griffe's copy while the site is built.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``")
# "[a][b]" in prose (an index, not a Markdown reference link: the docstrings have none).
_BRACKETS = re.compile(r"\[([^\]\n`]*)\]\[([^\]\n`]*)\]")
# An Args entry whose list of names wraps ("a, b,\n    c: ..."): one line, as griffe reads entries.
_WRAPPED_NAMES = re.compile(r"(\n[ \t]+(?:\w+, )+\w+,)\n[ \t]+")


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def markdown(text: str) -> str:
    """The docstring ``text`` in Markdown (doctest blocks fenced, roles and literals as code)."""
    parts = re.split(r"(```pycon\n.*?```)", _fence_doctests(text), flags=re.S)
    for n, part in enumerate(parts):
        if not part.startswith("```pycon"):
            part = _ROLE.sub(lambda m: f"`{m.group(1)}`", part)
            part = _LITERAL.sub(lambda m: f"`{m.group(1)}`", part)
            pieces = re.split(r"(`[^`]*`)", _WRAPPED_NAMES.sub(r"\1 ", part))
            parts[n] = "".join(p if p.startswith("`") else _BRACKETS.sub(r"\[\1\]\[\2\]", p) for p in pieces)
    return "".join(parts)


class MarkdownDocstrings(griffe.Extension):
    """Rewrites every object's docstring as Markdown when griffe loads it."""

    def on_object(self, *, obj: griffe.Object, loader: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
