"""Price tables: validation with field paths, first-match lookup, cost arithmetic."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from orchestrator_core.errors import InvalidParams, OrchestratorError
from orchestrator_core.pricing import Price, PriceTable, Unpriced, round_usd

TABLE: dict[str, Any] = {
    "version": "2026-11-01",
    "unpriced": "refuse",
    "entries": [
        {"engine": "sim", "model": "*", "free": True},
        {"engine": "llama", "model": "Gemma 3 270m", "per_decode_second_usd": 0.00001},
        {
            "engine": "openai",
            "model": "gpt-4o-mini*",
            "input_per_million_usd": 0.15,
            "output_per_million_usd": 0.60,
        },
        {
            "engine": "openai",
            "model": "gpt-4o*",
            "input_per_million_usd": 2.5,
            "output_per_million_usd": 10,
        },
    ],
}


def table(**changes: Any) -> PriceTable:
    data = copy.deepcopy(TABLE)
    data.update(changes)
    return PriceTable.from_dict(data, source="test")


def with_entry(entry: Any, **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(TABLE)
    data["entries"].append(entry)
    data.update(changes)
    return data


# --- cost arithmetic -----------------------------------------------------------------------


def test_token_cost_is_per_million_in_and_out() -> None:
    price = Price("tokens", input_per_million=0.15, output_per_million=0.60)
    assert price.cost(1_000_000, 1_000_000, 0) == 0.75
    assert price.cost(1_000_000, 0, 99.0) == 0.15  # decode time is not charged
    assert price.cost(0, 1_000_000, 0) == 0.6
    assert price.cost(1234, 567, 0) == 0.0005253  # (1234*0.15 + 567*0.60) / 1e6
    assert price.cost(0, 0, 0) == 0.0


def test_decode_second_cost() -> None:
    price = Price("decode_seconds", per_second=0.00001)
    assert price.cost(10_000, 10_000, 2.5) == 0.000025  # tokens are not charged
    assert price.cost(0, 0, 0) == 0.0
    assert price.cost(0, 0, 3600) == 0.036


def test_free_costs_nothing() -> None:
    price = Price("free")
    assert price.cost(10**9, 10**9, 1e6) == 0.0
    assert price.worst_case(10**9, 10**9, None) == 0.0


def test_costs_round_to_a_nano_dollar() -> None:
    price = Price("tokens", input_per_million=0.15, output_per_million=0.60)
    assert price.cost(1, 0, 0) == 0.00000015  # exactly 150 nano-dollars
    assert price.cost(7, 3, 0) == 0.00000285
    tiny = Price("tokens", input_per_million=0.0004, output_per_million=0.0016)
    assert tiny.cost(1, 0, 0) == 0.0  # 4e-10 USD rounds away
    assert tiny.cost(0, 1, 0) == 0.000000002  # 1.6e-9 -> 2e-9
    per_second = Price("decode_seconds", per_second=0.00001)
    assert per_second.cost(0, 0, 0.1234567891) == 0.000001235  # 1.234567891e-6
    assert per_second.cost(0, 0, 0.00001) == 0.0  # 1e-10 rounds away
    # equal inputs give equal floats; binary noise below a nano-dollar disappears
    assert 0.1 + 0.2 != 0.3
    assert round_usd(0.1 + 0.2) == 0.3
    assert str(round_usd(-0.0)) == "0.0"
    costs = {price.cost(1234, 567, 0) for _ in range(3)}
    assert costs == {0.0005253}


def test_worst_case() -> None:
    tokens = Price("tokens", input_per_million=2.5, output_per_million=10)
    assert tokens.worst_case(1000, 500, None) == 0.0075
    assert tokens.worst_case(1000, 500, 10.0) == 0.0075
    per_second = Price("decode_seconds", per_second=0.00001)
    assert per_second.worst_case(1000, 500, None) is None  # unbounded
    assert per_second.worst_case(1000, 500, 120) == 0.0012
    assert Price("free").worst_case(1, 1, 1) == 0.0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, 0, 0), "tokens_in"),
        ((0, -1, 0), "tokens_out"),
        ((1.5, 0, 0), "tokens_in"),
        ((True, 0, 0), "tokens_in"),
        ((0, 0, -0.5), "decode_seconds"),
        ((0, 0, float("nan")), "decode_seconds"),
        ((0, 0, float("inf")), "decode_seconds"),
    ],
)
def test_cost_rejects_bad_usage(args: tuple[Any, Any, Any], field: str) -> None:
    with pytest.raises(InvalidParams) as info:
        Price("tokens", input_per_million=1, output_per_million=1).cost(*args)
    assert info.value.field == field


def test_worst_case_rejects_bad_bound() -> None:
    with pytest.raises(InvalidParams) as info:
        Price("decode_seconds", per_second=1).worst_case(0, 0, -1)
    assert info.value.field == "max_seconds"


def test_price_checks_its_own_fields() -> None:
    with pytest.raises(ValueError, match="has no per_second"):
        Price("tokens", input_per_million=1, output_per_million=1, per_second=1)
    with pytest.raises(ValueError, match="finite"):
        Price("decode_seconds", per_second=-1)
    with pytest.raises(ValueError, match="unknown price kind"):
        Price("gold")  # type: ignore[arg-type]


# --- lookup ---------------------------------------------------------------------------------


def test_price_for_each_form_with_entry_index() -> None:
    t = table()
    assert t.version == "2026-11-01"
    assert t.price_for("sim", "sim-1") == Price("free", entry_index=0)
    assert t.price_for("llama", "Gemma 3 270m") == Price(
        "decode_seconds", per_second=0.00001, entry_index=1
    )
    assert t.price_for("openai", "gpt-4o-mini-2024-07-18") == Price(
        "tokens", input_per_million=0.15, output_per_million=0.6, entry_index=2
    )


def test_first_match_wins() -> None:
    t = table()
    # "gpt-4o*" also matches, but the earlier "gpt-4o-mini*" entry wins
    assert t.price_for("openai", "gpt-4o-mini").entry_index == 2
    assert t.price_for("openai", "gpt-4o").entry_index == 3
    assert t.price_for("openai", "gpt-4o-2024-08-06").entry_index == 3
    reordered = copy.deepcopy(TABLE)
    reordered["entries"][2], reordered["entries"][3] = (
        reordered["entries"][3],
        reordered["entries"][2],
    )
    t2 = PriceTable.from_dict(reordered, source="test")
    assert t2.price_for("openai", "gpt-4o-mini").input_per_million == 2.5


def test_glob_is_case_sensitive_and_engine_exact() -> None:
    t = table()
    with pytest.raises(Unpriced):
        t.price_for("openai", "GPT-4o-mini")
    with pytest.raises(Unpriced):
        t.price_for("llama", "gemma 3 270m")
    with pytest.raises(Unpriced):
        t.price_for("llama", "Gemma 3 270m-it")  # no glob: exact name
    with pytest.raises(Unpriced):
        t.price_for("openai", "Gemma 3 270m")  # the llama entry is for llama only
    with pytest.raises(Unpriced):
        t.price_for("Sim", "sim-1")
    assert t.entry_for("vllm", "x") is None


def test_glob_character_classes() -> None:
    t = PriceTable.from_dict(
        {
            "version": "2026-11-01",
            "unpriced": "refuse",
            "entries": [
                {"engine": "openai", "model": "m-[0-9]?", "free": True},
                {"engine": "openai", "model": "*/gemma*", "free": True},
            ],
        },
        source="test",
    )
    assert t.price_for("openai", "m-12").entry_index == 0
    assert t.price_for("openai", "google/gemma-3-270m-it").entry_index == 1
    with pytest.raises(Unpriced):
        t.price_for("openai", "m-a1")


def test_unpriced_refuse() -> None:
    with pytest.raises(Unpriced) as info:
        table().price_for("openai", "o3-pro")
    err = info.value
    assert isinstance(err, OrchestratorError)
    assert err.code == "PRICE_UNKNOWN"
    assert err.retriable is False
    assert "o3-pro" in err.message
    assert "openai" in err.message
    assert "2026-11-01" in err.message
    assert err.details == {"engine": "openai", "model": "o3-pro", "price_table": "2026-11-01"}
    assert err.body()["code"] == "PRICE_UNKNOWN"


def test_unpriced_free_is_free_without_entry() -> None:
    t = table(unpriced="free")
    price = t.price_for("openai", "o3-pro")
    assert price == Price("free", entry_index=None)
    assert price.cost(100, 100, 1) == 0.0
    # matching entries keep their prices
    assert t.price_for("openai", "gpt-4o").kind == "tokens"


def test_empty_entries_are_allowed() -> None:
    t = table(entries=[])
    assert t.entries == ()
    with pytest.raises(Unpriced):
        t.price_for("sim", "sim-1")
    assert table(entries=[], unpriced="free").price_for("sim", "sim-1").kind == "free"


def test_integers_are_accepted_as_prices() -> None:
    t = table()
    assert t.price_for("openai", "gpt-4o").output_per_million == 10.0
    zero = PriceTable.from_dict(
        with_entry(
            {
                "engine": "openai",
                "model": "cheap",
                "input_per_million_usd": 0,
                "output_per_million_usd": 0,
            }
        ),
        source="test",
    )
    assert zero.price_for("openai", "cheap").cost(10, 10, 0) == 0.0


def test_tables_compare_by_content() -> None:
    assert table() == PriceTable.from_dict(copy.deepcopy(TABLE), source="elsewhere")
    assert table().source == "test"


# --- validation -----------------------------------------------------------------------------

ENTRY_TOKENS = {
    "engine": "openai",
    "model": "x",
    "input_per_million_usd": 1,
    "output_per_million_usd": 2,
}


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        ([], "$", "mapping"),
        ("text", "$", "mapping"),
        (None, "$", "mapping"),
        ({**TABLE, "currency": "EUR"}, "currency", "unknown key"),
        ({k: v for k, v in TABLE.items() if k != "version"}, "version", "required"),
        ({k: v for k, v in TABLE.items() if k != "unpriced"}, "unpriced", "required"),
        ({k: v for k, v in TABLE.items() if k != "entries"}, "entries", "required"),
        ({**TABLE, "version": 20261101}, "version", "ISO date"),
        ({**TABLE, "version": "v1"}, "version", "ISO date"),
        ({**TABLE, "version": "2026-11-1"}, "version", "ISO date"),
        ({**TABLE, "version": "2026-02-30"}, "version", "calendar date"),
        ({**TABLE, "version": dt.date(2026, 11, 1)}, "version", 'quote it: "2026-11-01"'),
        ({**TABLE, "unpriced": "charge"}, "unpriced", "'refuse' or 'free'"),
        ({**TABLE, "unpriced": None}, "unpriced", "'refuse' or 'free'"),
        ({**TABLE, "unpriced": True}, "unpriced", "'refuse' or 'free'"),
        ({**TABLE, "entries": {"engine": "sim"}}, "entries", "must be a list"),
        ({**TABLE, "entries": None}, "entries", "must be a list"),
        (with_entry("sim"), "entries[4]", "must be a mapping"),
        (
            with_entry({"engine": "sim", "model": "x", "free": True, "note": 1}),
            "entries[4].note",
            "unknown key",
        ),
        (with_entry({"model": "x", "free": True}), "entries[4].engine", "required"),
        (
            with_entry({"engine": "", "model": "x", "free": True}),
            "entries[4].engine",
            "non-empty string",
        ),
        (
            with_entry({"engine": 3, "model": "x", "free": True}),
            "entries[4].engine",
            "non-empty string",
        ),
        (with_entry({"engine": "sim", "free": True}), "entries[4].model", "required"),
        (
            with_entry({"engine": "sim", "model": " ", "free": True}),
            "entries[4].model",
            "non-empty string",
        ),
        (
            with_entry({"engine": "sim", "model": None, "free": True}),
            "entries[4].model",
            "non-empty string",
        ),
        (with_entry({"engine": "sim", "model": "x"}), "entries[4]", "needs one pricing form"),
        (
            with_entry({"engine": "sim", "model": "x", "free": False}),
            "entries[4].free",
            "must be true",
        ),
        (
            with_entry({"engine": "sim", "model": "x", "free": "yes"}),
            "entries[4].free",
            "must be true",
        ),
        (with_entry({**ENTRY_TOKENS, "free": True}), "entries[4]", "more than one pricing form"),
        (
            with_entry({**ENTRY_TOKENS, "per_decode_second_usd": 1}),
            "entries[4]",
            "more than one pricing form",
        ),
        (
            with_entry({"engine": "sim", "model": "x", "free": True, "per_decode_second_usd": 0}),
            "entries[4]",
            "more than one pricing form",
        ),
        (
            with_entry({"engine": "openai", "model": "x", "input_per_million_usd": 1}),
            "entries[4].output_per_million_usd",
            "required together with input_per_million_usd",
        ),
        (
            with_entry({"engine": "openai", "model": "x", "output_per_million_usd": 1}),
            "entries[4].input_per_million_usd",
            "required together with output_per_million_usd",
        ),
        (
            with_entry({**ENTRY_TOKENS, "input_per_million_usd": -0.01}),
            "entries[4].input_per_million_usd",
            ">= 0",
        ),
        (
            with_entry({**ENTRY_TOKENS, "output_per_million_usd": -1}),
            "entries[4].output_per_million_usd",
            ">= 0",
        ),
        (
            with_entry({**ENTRY_TOKENS, "input_per_million_usd": "0.15"}),
            "entries[4].input_per_million_usd",
            "must be a number",
        ),
        (
            with_entry({**ENTRY_TOKENS, "output_per_million_usd": True}),
            "entries[4].output_per_million_usd",
            "must be a number",
        ),
        (
            with_entry({**ENTRY_TOKENS, "input_per_million_usd": float("nan")}),
            "entries[4].input_per_million_usd",
            "finite",
        ),
        (
            with_entry({**ENTRY_TOKENS, "output_per_million_usd": float("inf")}),
            "entries[4].output_per_million_usd",
            "finite",
        ),
        (
            with_entry({"engine": "llama", "model": "x", "per_decode_second_usd": -1e-6}),
            "entries[4].per_decode_second_usd",
            ">= 0",
        ),
        (
            with_entry({"engine": "llama", "model": "x", "per_decode_second_usd": None}),
            "entries[4].per_decode_second_usd",
            "must be a number",
        ),
        (
            with_entry({"engine": "openai", "model": "gpt-4o*", "free": True}),
            "entries[4].model",
            "repeats entries[3]",
        ),
    ],
)
def test_validation_names_the_field(data: Any, field: str, fragment: str) -> None:
    with pytest.raises(InvalidParams) as info:
        PriceTable.from_dict(data, source="tables/x.yaml")
    err = info.value
    assert err.field == field
    assert fragment in err.message
    assert err.message.startswith(f"{field}: ")
    assert err.details["errors"][0]["field"] == field
    assert err.details["source"] == "tables/x.yaml"


def test_same_model_on_another_engine_is_not_a_repeat() -> None:
    t = PriceTable.from_dict(
        with_entry({"engine": "llama", "model": "gpt-4o*", "free": True}), source="test"
    )
    assert t.price_for("llama", "gpt-4o").kind == "free"


def test_known_engines_are_checked_when_given() -> None:
    engines = {"sim", "llama", "openai"}
    PriceTable.from_dict(copy.deepcopy(TABLE), source="test", engines=engines)
    with pytest.raises(InvalidParams) as info:
        PriceTable.from_dict(
            with_entry({"engine": "lama", "model": "x", "free": True}),
            source="test",
            engines=engines,
        )
    assert info.value.field == "entries[4].engine"
    assert "unknown engine 'lama'" in info.value.message
    assert "llama, openai, sim" in info.value.message


def test_unknown_non_string_key() -> None:
    with pytest.raises(InvalidParams) as info:
        PriceTable.from_dict({**TABLE, 3: "x"}, source="test")
    assert info.value.field == "$"
    with pytest.raises(InvalidParams) as info:
        PriceTable.from_dict(
            with_entry({"engine": "sim", "model": "x", "free": True, 1: 2}), source="test"
        )
    assert info.value.field == "entries[4]"
