"""JSON columns are written by orjson (compact) and read back whole, with the standard
library taking what orjson refuses (integers past 64 bits, non-finite floats)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import sqlalchemy as sa

from orchestratord.db import json_codec
from orchestratord.db.engine import Database
from orchestratord.db.models import Json

probe = sa.Table(
    "json_codec_probe",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("doc", Json),
)


async def _round_trip(db: Database, doc: Any) -> tuple[Any, str]:
    async with db.engine.begin() as conn:
        await conn.run_sync(probe.create, checkfirst=True)
        await conn.execute(probe.delete())
        await conn.execute(probe.insert().values(id=1, doc=doc))
    try:
        async with db.engine.connect() as conn:
            value = (await conn.execute(sa.select(probe.c.doc))).scalar_one()
            raw = await conn.execute(sa.text("SELECT CAST(doc AS TEXT) FROM json_codec_probe"))
            return value, raw.scalar_one()
    finally:
        async with db.engine.begin() as conn:
            await conn.run_sync(probe.drop)


async def test_written_compact_and_read_back(db: Database) -> None:
    value, raw = await _round_trip(db, {"a": 1, "b": [1.5, "é", None], 3: True})
    assert raw == '{"a":1,"b":[1.5,"é",null],"3":true}'  # json.dumps would write spaces
    assert value == {"a": 1, "b": [1.5, "é", None], "3": True}


async def test_what_orjson_refuses_goes_through_the_standard_library(db: Database) -> None:
    big = 2**70
    value, raw = await _round_trip(db, {"big": big})
    assert value == {"big": big} and str(big) in raw


def test_non_finite_floats_are_not_turned_into_null() -> None:
    # orjson would write null; PostgreSQL refuses NaN in a JSON column, SQLite keeps it
    text = json_codec.dumps({"x": math.nan, "y": math.inf, "z": None})
    assert text == '{"x":NaN,"y":Infinity,"z":null}'
    back = json_codec.loads(text)
    assert math.isnan(back["x"]) and back["y"] == math.inf and back["z"] is None


def test_a_value_holding_none_but_no_non_finite_float_is_written_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``null`` in orjson's text is a NaN only if the value holds one: a ``None`` alone is
    not encoded a second time."""
    calls: list[object] = []
    real = json_codec._standard

    def counted(value: object) -> str:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(json_codec, "_standard", counted)
    assert json_codec.dumps({"a": None, "b": [1.5, None, {"c": 2}]}) == (
        '{"a":null,"b":[1.5,null,{"c":2}]}'
    )
    assert calls == []
    for hidden in ([None, [math.nan]], {"a": None, "b": {"c": (1, -math.inf)}}, {math.nan: None}):
        text = json_codec.dumps(hidden)
        assert "NaN" in text or "Infinity" in text, text
    assert len(calls) == 3
