"""A run bundle: one finished run with everything it recorded, to move between databases.

Rows travel as JSON objects of their table's columns, named as in the table; timestamps are
RFC 3339 strings. An event row keeps ``data``, the JSON text that was streamed, byte for
byte. Autoincrement surrogate keys (``events.id``, ``facts.id``) do not travel: the order of
``events`` (by ``run_seq``) and ``facts`` (append order) carries what they meant.

An import refuses (422, naming the field, the step and the event seq) a bundle whose parts
disagree: outputs that are not their tokens, hashes that are not their inputs', events that
are not the rows they name, seqs out of order (``orchestratord/runs/transfer_checks.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from contracts.bounds import MAX_JSON_DEPTH
from contracts.common import Strict

BUNDLE_FORMAT = "orchestratord.run/v1"

Row = dict[str, Any]


class RunBundle(Strict):
    # A row is an object in a list; its JSON columns hold request values a level or two
    # below where the request had them (a step's ``input.args``, a flow's ``ast``).
    json_depth: ClassVar[int] = MAX_JSON_DEPTH + 8

    format: Literal["orchestratord.run/v1"] = Field(description="the bundle format and version")
    flow: Row = Field(description="the run's flow: a row of the flows table")
    run: Row = Field(description="a row of the runs table")
    steps: list[Row] = Field(description="rows of the steps table, by position; all ended")
    events: list[Row] = Field(
        description="rows of the events table, by run_seq: run_id, run_seq, step_id, seq, "
        "type and data (the streamed JSON text, unchanged)"
    )
    facts: list[Row] = Field(description="rows of the facts table, in append order")
    checkpoints: list[Row] = Field(description="rows of the checkpoints table")
