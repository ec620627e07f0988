"""Price tables on disk: the shipped versions, the price book, file and line in errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from orchestrator_core.errors import NotFound
from orchestrator_core.pricing import Price, Unpriced
from orchestratord.prices import (
    PRICE_DIR,
    PriceBook,
    PriceConfigError,
    load_price_table,
    load_price_tables,
)

GOOD = """\
version: "2026-12-01"
unpriced: refuse
entries:
  - engine: sim
    model: "*"
    free: true
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


# --- the shipped tables ---------------------------------------------------------------------


def test_shipped_tables_load() -> None:
    tables = load_price_tables()
    assert sorted(tables) == ["2026-11-01", "2026-11-15"]
    assert PRICE_DIR.name == "price_tables"
    for version, table in tables.items():
        assert table.version == version
        assert table.unpriced == "refuse"
        assert table.source == str(PRICE_DIR / f"{version}.yaml")


def test_shipped_prices() -> None:
    book = PriceBook.load()
    old = book.get("2026-11-01")
    assert old.price_for("sim", "sim-1").kind == "free"
    assert old.price_for("sim", "anything at all").kind == "free"
    gemma = old.price_for("llama", "Gemma 3 270m")
    assert gemma.kind == "decode_seconds"
    assert gemma.per_second == 0.00001
    assert gemma.cost(0, 0, 10) == 0.0001
    mini = old.price_for("openai", "gpt-4o-mini-2024-07-18")
    assert (mini.input_per_million, mini.output_per_million) == (0.15, 0.6)
    assert mini.cost(1_000_000, 1_000_000, 0) == 0.75
    big = old.price_for("openai", "gpt-4o-2024-08-06")  # after the more specific mini entry
    assert (big.input_per_million, big.output_per_million) == (2.5, 10.0)
    nano = old.price_for("openai", "gpt-4.1-nano")
    assert (nano.input_per_million, nano.output_per_million) == (0.1, 0.4)
    for model in ("gemma-3-270m-it", "google/gemma-3-270m-it"):
        served = old.price_for("openai", model)
        assert (served.input_per_million, served.output_per_million) == (0.02, 0.04)
    with pytest.raises(Unpriced) as info:
        old.price_for("openai", "fake-model")
    assert info.value.details == {
        "engine": "openai",
        "model": "fake-model",
        "price_table": "2026-11-01",
    }
    with pytest.raises(Unpriced):
        old.price_for("llama.cpp", "Gemma 3 270m")  # capabilities' engine is not the kind


def test_later_version_changes_prices() -> None:
    book = PriceBook.load()
    old, new = book.get("2026-11-01"), book.get("2026-11-15")
    assert new.price_for("llama", "Gemma 3 270m").per_second == 0.000012
    assert new.price_for("llama", "Gemma 3 270m").cost(0, 0, 10) == 0.00012
    assert new.price_for("openai", "gemma-3-270m-it").output_per_million == 0.05
    assert old.price_for("openai", "gemma-3-270m-it").output_per_million == 0.04
    assert old != new
    # unchanged prices stay equal across versions
    assert old.price_for("openai", "gpt-4o-mini") == new.price_for("openai", "gpt-4o-mini")


def test_price_book_versions_latest_get() -> None:
    book = PriceBook.load()
    assert book.versions() == ["2026-11-01", "2026-11-15"]
    assert book.latest().version == "2026-11-15"
    assert book.latest() is book.get("2026-11-15")
    with pytest.raises(NotFound) as info:
        book.get("2026-10-01")
    assert info.value.code == "NOT_FOUND"
    assert info.value.details == {"kind": "price table", "id": "2026-10-01"}


def test_price_book_orders_by_version(tmp_path: Path) -> None:
    for version in ("2027-01-01", "2026-12-31", "2026-02-01"):
        write(tmp_path, f"{version}.yaml", GOOD.replace("2026-12-01", version))
    write(tmp_path, "notes.txt", "not a table")
    book = PriceBook.load(tmp_path)
    assert book.versions() == ["2026-02-01", "2026-12-31", "2027-01-01"]
    assert book.latest().version == "2027-01-01"


def test_price_book_needs_a_table() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PriceBook({})
    table = load_price_tables()["2026-11-01"]
    with pytest.raises(ValueError, match="filed under"):
        PriceBook({"2026-11-02": table})


def test_shipped_files_are_named_by_version() -> None:
    for path in PRICE_DIR.glob("*.yaml"):
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", path.stem)
        assert load_price_table(path).version == path.stem


# --- errors name the file and the line --------------------------------------------------------


def test_directory_with_a_bad_file_names_it(tmp_path: Path) -> None:
    write(tmp_path, "2026-12-01.yaml", GOOD)
    bad = write(
        tmp_path,
        "2026-12-02.yaml",
        GOOD.replace("2026-12-01", "2026-12-02")
        + "  - engine: openai\n    model: gpt\n    input_per_million_usd: -1\n"
        + "    output_per_million_usd: 1\n",
    )
    with pytest.raises(PriceConfigError) as info:
        load_price_tables(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{bad}: entries[1].input_per_million_usd (line 9): ")
    assert ">= 0" in message


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    bad = write(tmp_path, "2026-12-01.yaml", 'version: "2026-12-01"\nentries: [\n')
    with pytest.raises(PriceConfigError) as info:
        load_price_tables(tmp_path)
    assert str(info.value).startswith(f"{bad}: not valid YAML")


def test_stem_must_equal_version(tmp_path: Path) -> None:
    bad = write(tmp_path, "2026-12-02.yaml", GOOD)
    with pytest.raises(PriceConfigError) as info:
        load_price_tables(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{bad}: version (line 1): ")
    assert "'2026-12-01' does not match the file name" in message


def test_copied_table_under_another_name_fails(tmp_path: Path) -> None:
    shutil.copy(PRICE_DIR / "2026-11-01.yaml", tmp_path / "2026-11-20.yaml")
    with pytest.raises(PriceConfigError, match="does not match the file name"):
        load_price_tables(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("unpriced: refuse", "unpriced: maybe"), "unpriced (line 2): must be"),
        (GOOD.replace('"2026-12-01"', "2026-12-01"), "version (line 1): must be a string; quote"),
        (GOOD + "currency: EUR\n", "currency (line 7): unknown key"),
        (GOOD.replace("    free: true\n", ""), "entries[0] (line 4): needs one pricing form"),
        (GOOD.replace("free: true", "free: false"), "entries[0].free (line 6): must be true"),
        (GOOD.replace("engine: sim", "engine: lama"), "entries[0].engine (line 4): unknown"),
        (
            GOOD.replace("free: true", "per_decode_second_usd: 1e-5"),
            "entries[0].per_decode_second_usd (line 6): must be a number, not str",
        ),
        ("- just\n- a list\n", "$ (line 1): a price table must be a mapping"),
        ("", "$: a price table must be a mapping"),
        (GOOD + "unpriced: free\n", "unpriced (line 7): key repeated"),
        (
            GOOD + "  - engine: sim\n    model: x\n    model: y\n    free: true\n",
            "model (line 9): key repeated",
        ),
    ],
)
def test_errors_name_field_and_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "2026-12-01.yaml", text)
    with pytest.raises(PriceConfigError) as info:
        load_price_table(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_missing_required_key_points_at_the_table(tmp_path: Path) -> None:
    path = write(tmp_path, "2026-12-01.yaml", GOOD.replace("unpriced: refuse\n", ""))
    with pytest.raises(PriceConfigError) as info:
        load_price_table(path)
    assert str(info.value) == f"{path}: unpriced (line 1): required"


def test_missing_or_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(PriceConfigError, match="not a directory"):
        load_price_tables(tmp_path / "absent")
    with pytest.raises(PriceConfigError, match=r"no price tables \(\*\.yaml\)"):
        load_price_tables(tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "2026-12-01.yaml").mkdir()
    with pytest.raises(PriceConfigError, match="cannot read"):
        load_price_tables(tmp_path)


def test_loaded_price_is_a_price() -> None:
    price = PriceBook.load().latest().price_for("sim", "sim-1")
    assert price == Price("free", entry_index=0)
