"""A pool's own price, unpriced models, and the cost budget that needs a price."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core import budgets
from orchestrator_core.budgets import Ledger, Limits
from orchestrator_core.errors import InvalidParams
from orchestrator_core.pricing import (
    UNPRICED,
    Price,
    PriceTable,
    Unpriced,
    parse_price,
    resolve_price,
)

TABLE = PriceTable.from_dict(
    {
        "version": "2026-11-01",
        "unpriced": "refuse",
        "entries": [
            {
                "engine": "openai",
                "model": "gpt-4o*",
                "input_per_million_usd": 2.5,
                "output_per_million_usd": 10,
            }
        ],
    },
    source="test",
)
OWN = Price("tokens", input_per_million=3.0, output_per_million=15.0, pool_id="mine")


def test_a_pool_price_wins_over_the_table() -> None:
    assert resolve_price(TABLE, engine="openai", model="gpt-4o", own=OWN) is OWN
    assert resolve_price(TABLE, engine="openai", model="my-finetune", own=OWN) is OWN
    listed = resolve_price(TABLE, engine="openai", model="gpt-4o")
    assert listed.entry_index == 0 and listed.output_per_million == 10.0


def test_a_model_nothing_prices_is_unpriced_or_free_as_the_table_says() -> None:
    assert resolve_price(TABLE, engine="openai", model="my-finetune") is UNPRICED
    free_table = PriceTable.from_dict(
        {"version": "2026-11-01", "unpriced": "free", "entries": []}, source="test"
    )
    price = resolve_price(free_table, engine="openai", model="my-finetune")
    assert price.priced and price.charge(10, 10, 1.0) == 0.0


def test_an_unpriced_charge_is_none_never_zero() -> None:
    assert not UNPRICED.priced
    assert UNPRICED.charge(10, 20, 0.5) is None
    assert UNPRICED.worst_case(10, 20, None) is None
    with pytest.raises(ValueError, match="unpriced"):
        UNPRICED.cost(10, 20, 0.5)
    with pytest.raises(InvalidParams):  # usage is checked all the same
        UNPRICED.charge(-1, 0, 0.0)
    assert OWN.charge(1_000_000, 1_000_000, 0.0) == 18.0
    with pytest.raises(ValueError, match="never unpriced"):
        Price("unpriced", pool_id="mine")


def test_provenance_names_where_the_price_came_from() -> None:
    assert OWN.describe() == {
        "source": "pool",
        "pool_id": "mine",
        "input_per_million_usd": 3.0,
        "output_per_million_usd": 15.0,
    }
    assert TABLE.entries[0].price.describe() == {
        "source": "table",
        "entry": 0,
        "input_per_million_usd": 2.5,
        "output_per_million_usd": 10.0,
    }
    assert Price("free").describe() == {"source": "table", "entry": None, "free": True}
    assert Price("decode_seconds", per_second=0.5, pool_id="p").describe() == {
        "source": "pool",
        "pool_id": "p",
        "per_decode_second_usd": 0.5,
    }
    assert UNPRICED.describe() == {"source": "unpriced"}


@pytest.mark.parametrize(
    ("run", "step"),
    [({"max_cost_usd": 1.0}, {}), ({}, {"max_cost_usd": 1.0}), ({"max_cost_usd": 0}, {})],
)
def test_a_cost_budget_refuses_an_unpriced_model(run: dict[str, Any], step: dict[str, Any]) -> None:
    with pytest.raises(Unpriced) as info:
        budgets.require_price(
            UNPRICED,
            run=Limits.from_dict(run),
            step=Limits.from_dict(step),
            engine="openai",
            model="my-finetune",
            price_table="2026-11-01",
        )
    assert info.value.code == "PRICE_UNKNOWN"
    assert info.value.details == {
        "engine": "openai",
        "model": "my-finetune",
        "price_table": "2026-11-01",
    }


def test_without_a_cost_budget_an_unpriced_model_may_run() -> None:
    other = Limits(max_tokens_out=100, max_tokens_in=100, max_wall_ms=1000)
    for price in (UNPRICED, OWN):
        budgets.require_price(
            price, run=other, step=Limits(), engine="e", model="m", price_table="v"
        )
    budgets.require_price(  # a priced model under a cost budget is for plan() to fit
        OWN, run=Limits(max_cost_usd=1.0), step=Limits(), engine="e", model="m", price_table="v"
    )


def test_an_unpriced_step_reserves_no_cost() -> None:
    reservation = budgets.plan(
        run=Limits(max_tokens_out=10),
        step=Limits(),
        ledger=Ledger(),
        tokens_in=5,
        max_tokens=20,
        price=UNPRICED,
        run_elapsed_ms=0.0,
    )
    assert reservation.cost_usd == 0.0
    assert reservation.tokens_out == 10 and reservation.clamped  # token budgets still apply
    with pytest.raises(ValueError, match="require_price"):
        budgets.plan(
            run=Limits(max_cost_usd=1.0),
            step=Limits(),
            ledger=Ledger(),
            tokens_in=5,
            max_tokens=20,
            price=UNPRICED,
            run_elapsed_ms=0.0,
        )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({}, "price"),
        ({"input_per_million_usd": 1.0}, "price.output_per_million_usd"),
        ({"free": True, "per_decode_second_usd": 1.0}, "price"),
        ({"free": "yes"}, "price.free"),
        ({"per_decode_second_usd": -1}, "price.per_decode_second_usd"),
        ({"per_decode_second_usd": float("inf")}, "price.per_decode_second_usd"),
        ({"per_decode_second_usd": "1"}, "price.per_decode_second_usd"),
    ],
)
def test_parse_price_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidParams) as info:
        parse_price(raw, path="price")
    assert info.value.field == field


def test_parse_price_carries_where_it_came_from() -> None:
    price = parse_price({"per_decode_second_usd": 0.25}, path="price", pool_id="mine")
    assert price == Price("decode_seconds", per_second=0.25, pool_id="mine")
