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

No line carries a credential: ``scrub_logs`` installs :class:`SecretsFilter` on the loggers
of this service, its engine adapters and httpx (whose INFO line ``HTTP Request: POST <url>``
would show a replica URL's user and password), masking every configured secret and any
credential written in a URL (``orchestrator_core.secrets``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from orchestrator_core.secrets import Scrubber
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
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info:
            out["exception"] = record.exc_text or self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


# The loggers whose records may quote a URL or an upstream reply: this service's, its
# adapters', its HTTP client's and its server's (``uvicorn.access`` writes each request's
# path and query). A filter on a logger sees the records created on that logger only (not
# its children's), so each one present is given the filter.
_SCRUBBED_ROOTS = (
    "orchestratord",
    "orchestrator_core",
    "worker_adapters",
    "httpx",
    "httpcore",
    "uvicorn",
)


class SecretsFilter(logging.Filter):
    """Rewrites a record's message, its ``extra`` values and its traceback text with the
    secrets masked. One instance serves the process; each service started in it adds the
    secrets it knows."""

    def __init__(self) -> None:
        super().__init__("secrets")
        self.scrubber = Scrubber()

    def add(self, scrubber: Scrubber) -> None:
        self.scrubber = self.scrubber.union(scrubber)

    def filter(self, record: logging.LogRecord) -> bool:
        scrubber = self.scrubber
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: let the handler report it as it would
            return True
        clean = scrubber.text(message)
        if clean != message:
            record.msg, record.args = clean, ()
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD and isinstance(value, str | dict | list):
                record.__dict__[key] = scrubber.value(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = scrubber.text(logging.Formatter().formatException(record.exc_info))
        return True


SECRETS_FILTER = SecretsFilter()


def scrub_logs(scrubber: Scrubber) -> None:
    """Mask ``scrubber``'s secrets (and URL credentials) in every log line from here on."""
    SECRETS_FILTER.add(scrubber)
    manager = logging.Logger.manager
    names = [
        name
        for name in list(manager.loggerDict)
        if name.split(".")[0] in _SCRUBBED_ROOTS
        and isinstance(manager.loggerDict[name], logging.Logger)
    ]
    for name in {*_SCRUBBED_ROOTS, *names}:
        logger = logging.getLogger(name)
        if SECRETS_FILTER not in logger.filters:
            logger.addFilter(SECRETS_FILTER)
