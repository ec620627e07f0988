"""Fixtures shared by the adapter tests."""

from __future__ import annotations

import pytest


class ManualClock:
    """A reference runtime's clock that moves only when a test sets ``now`` (idle expiry)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
