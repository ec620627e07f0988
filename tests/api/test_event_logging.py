from __future__ import annotations

import json
import logging

from orchestratord.event_logging import EventLogLines, JsonFormatter
from orchestratord.eventlog import LogEvent, make_event


def _events() -> list[LogEvent]:
    started = make_event(
        "run_1", "step_1", 0, "started", {"seed": 7, "prompt_hash": "sha256:p", "pool_id": "local"}
    )
    token = make_event("run_1", "step_1", 1, "token", {"i": 0, "t": "a", "token_id": 3})
    end = make_event(
        "run_1",
        "step_1",
        2,
        "end",
        {"stop_reason": "eos", "provenance": {"seed": 7, "tokens_out": 1, "cost_usd": 0.0}},
    )
    for n, ev in enumerate((started, token, end)):
        ev.run_seq = n
    return [started, token, end]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _capture(level: int) -> tuple[_Records, list[list[LogEvent]]]:
    logger = logging.getLogger("orchestratord.events")
    handler = _Records()
    logger.addHandler(handler)
    logger.setLevel(level)
    published: list[list[LogEvent]] = []
    lines = EventLogLines(published.append)
    try:
        lines(_events())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    return handler, published


def test_a_line_per_event_with_what_is_known_of_provenance() -> None:
    handler, published = _capture(logging.DEBUG)
    assert [len(batch) for batch in published] == [3]  # handed on unchanged
    records = handler.records
    assert [r.__dict__["event"]["type"] for r in records] == ["started", "token", "end"]
    assert [r.levelno for r in records] == [logging.INFO, logging.DEBUG, logging.INFO]
    assert records[1].__dict__["provenance"] == {
        "seed": 7,
        "prompt_hash": "sha256:p",
        "pool_id": "local",
    }
    assert records[2].__dict__["provenance"]["tokens_out"] == 1
    assert records[2].__dict__["event"] == {
        "run_id": "run_1",
        "run_seq": 2,
        "step_id": "step_1",
        "seq": 2,
        "type": "end",
    }


def test_tokens_are_not_logged_at_info() -> None:
    handler, _ = _capture(logging.INFO)
    assert [r.__dict__["event"]["type"] for r in handler.records] == ["started", "end"]


def test_json_lines_carry_the_extras() -> None:
    handler, _ = _capture(logging.INFO)
    line = json.loads(JsonFormatter().format(handler.records[-1]))
    assert line["logger"] == "orchestratord.events" and line["level"] == "INFO"
    assert line["event"]["seq"] == 2 and line["provenance"]["seed"] == 7
    assert line["message"].startswith("event end step=step_1")
