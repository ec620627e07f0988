"""Runs as a process last read them, kept for submissions that can do without reading again.

A run's settings (flow, mode, seed, budgets, policies, price table, creation time) never
change once it exists. What does change (its status, its ledger, its step count) is kept as
last seen and is only a hint: whoever uses a kept run checks what changes in the database,
in the statement that writes (``steps/submission/fast_path.py``), and reads the run again
when that check fails. So a kept run is safe across processes: another process may end the run or
spend its budget, and the check sees it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from orchestrator_core.budgets import Ledger


class KeptRuns:
    """The runs last read, at most ``size`` of them, the least recently used let go first.

    Each is its row's values by column name, as read; only running record runs are kept
    (the only ones a submission takes without reading)."""

    def __init__(self, size: int = 4096) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, not {size}")
        self.size = size
        self._runs: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The run's values as last seen (not to be changed), or None."""
        values = self._runs.get(run_id)
        if values is not None:
            self._runs.move_to_end(run_id)
        return values

    def keep(self, run_id: str, values: dict[str, Any]) -> None:
        """Keep a running record run's values; any other run is let go."""
        if self.size == 0 or values.get("mode") != "record" or values.get("status") != "running":
            self._runs.pop(run_id, None)
            return
        self._runs[run_id] = values
        self._runs.move_to_end(run_id)
        while len(self._runs) > self.size:
            self._runs.popitem(last=False)

    def saw_ledger(self, run_id: str, ledger: Ledger) -> None:
        """The run's ledger as a statement returned it (newer than the kept one)."""
        values = self._runs.get(run_id)
        if values is not None:
            values.update(
                tokens_in_used=ledger.used_in,
                tokens_out_used=ledger.used_out,
                cost_used_usd=ledger.used_cost,
                tokens_in_reserved=ledger.reserved_in,
                tokens_out_reserved=ledger.reserved_out,
                cost_reserved_usd=ledger.reserved_cost,
            )

    def drop(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
