"""Files generated from the contracts and committed (the OpenAPI document, JSON Schemas):
``python -m <module>`` writes one, ``--check`` fails when the committed one drifted."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, argv: list[str], *, module: str) -> int:
    """Write ``text`` to ``path``; with ``--check`` in ``argv``, 1 if ``path`` differs."""
    if "--check" in argv:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date: run python -m {module}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0
