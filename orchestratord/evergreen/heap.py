"""Freed memory handed back to the operating system once the front door falls idle.

A session holds up to ``evergreen.max_bytes`` of the client's nodes, most of it in blocks
glibc's allocator keeps for reuse once they are freed: 200 sessions abandoned at once left
the process 70 MB larger after every one of them had ended and been collected. When the
last session ends, :func:`trim` (``malloc_trim``) returns those pages. Elsewhere than glibc
it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        found: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return found


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return the allocator's free pages to the system; whether any were (False where the
    allocator is not glibc's). Blocking: run it in a thread."""
    if _TRIM is None:
        return False
    return bool(_TRIM(0))
