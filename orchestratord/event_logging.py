"""One structured log line per committed event, carrying the step's provenance.

Logger ``orchestratord.events``. ``started``, ``end``, ``error``, ``fact`` and ``checkpoint``
lines are INFO; ``token`` and the other body events are DEBUG, so a production log at INFO
gets one line per step transition and ``ORCHESTRATORD_LOG_LEVEL=debug`` one line per event.
Each line's ``extra`` holds ``event`` = {run_id, run_seq, step_id, seq, type} and
``provenance`` = what is known of the step's provenance at that event: the determinism
inputs from ``started`` (seed, prompt_hash, params_hash, engine, engine_version, model_hash,
pool_id, replica_id, policy_hash, price_table) and, on ``end``/``error``, the full record
(plus tokens_in, tokens_out, cost_usd, decode_time_ms). With ``ORCHESTRATORD_LOG_FORMAT=json``
each line is one JSON object (see ``JsonFormatter``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from orchestratord.eventlog import LogEvent

log = logging.getLogger("orchestratord.events")

_INFO_TYPES = frozenset({"started", "end", "error", "fact", "checkpoint"})
_STARTED_FIELDS = (
    "seed",
    "prompt_hash",
    "params_hash",
    "engine",
    "engine_version",
    "model_hash",
    "pool_id",
    "replica_id",
    "policy_hash",
    "price_table",
)


class EventLogLines:
    """Wraps the publisher of committed events; logs each one before handing it on."""

    def __init__(self, publish: Callable[[list[LogEvent]], None]) -> None:
        self._publish = publish
        self._provenance: dict[str, dict[str, Any]] = {}

    def __call__(self, events: list[LogEvent]) -> None:
        if events and log.isEnabledFor(logging.INFO):
            debug = log.isEnabledFor(logging.DEBUG)
            for ev in events:
                self._log(ev, debug)
        self._publish(events)

    def _log(self, ev: LogEvent, debug: bool) -> None:
        info = ev.type in _INFO_TYPES
        if not info and not debug:
            return
        key = ev.step_id or ""
        if ev.type == "started":
            body = orjson.loads(ev.data)
            self._provenance[key] = {k: body.get(k) for k in _STARTED_FIELDS if k in body}
        provenance = self._provenance.get(key, {})
        if ev.terminal:
            body = orjson.loads(ev.data)
            provenance = body.get("provenance") or provenance
            self._provenance.pop(key, None)
        log.log(
            logging.INFO if info else logging.DEBUG,
            "event %s step=%s seq=%s run=%s run_seq=%s",
            ev.type,
            ev.step_id,
            ev.seq,
            ev.run_id,
            ev.run_seq,
            extra={
                "event": {
                    "run_id": ev.run_id,
                    "run_seq": ev.run_seq,
                    "step_id": ev.step_id,
                    "seq": ev.seq,
                    "type": ev.type,
                },
                "provenance": provenance,
            },
        )


_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()
