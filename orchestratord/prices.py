"""Price tables on disk: ``price_tables/<version>.yaml``, one file per version.

A file's name (less ``.yaml``) must equal the ``version`` inside it. Tables are never edited
once used: a price change is a new file with a later version, so a recorded
``price_table`` version always names the prices that were charged. See
:mod:`orchestrator_core.pricing` for the format.

Errors name the file and, where the YAML allows, the line (as the pools file does).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator_core.errors import InvalidParams, NotFound
from orchestrator_core.pricing import Price, PriceTable, resolve_price
from orchestratord.yaml_files import line_of, read_yaml
from worker_adapters.registry import ENGINES

PRICE_DIR = Path(__file__).with_name("price_tables")


class PriceConfigError(ValueError):
    pass


def _loc(field: str) -> list[Any]:
    """``entries[2].model`` -> ``["entries", 2, "model"]``."""
    loc: list[Any] = []
    for part in field.split("."):
        if part in ("", "$"):
            continue
        name, _, rest = part.partition("[")
        if name:
            loc.append(name)
        for index in rest.split("["):
            index = index.rstrip("]")
            if index.isdigit():
                loc.append(int(index))
    return loc


def _duplicate_key(node: yaml.Node | None) -> tuple[str, int] | None:
    """The first key repeated in a mapping of ``node`` (YAML keeps the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    return key.value, key.start_mark.line + 1
                seen.add(key.value)
            found = _duplicate_key(value)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _duplicate_key(item)
            if found:
                return found
    return None


def load_price_table(path: Path) -> PriceTable:
    node, data = read_yaml(path, PriceConfigError)
    duplicate = _duplicate_key(node)
    if duplicate:
        key, key_line = duplicate
        raise PriceConfigError(f"{path}: {key} (line {key_line}): key repeated in the same mapping")
    try:
        table = PriceTable.from_dict(data, source=str(path), engines=ENGINES)
    except InvalidParams as exc:
        line = line_of(node, _loc(exc.field))
        at = f" (line {line})" if line else ""
        message = exc.message.removeprefix(f"{exc.field}: ")
        raise PriceConfigError(f"{path}: {exc.field}{at}: {message}") from exc
    if table.version != path.stem:
        line = line_of(node, ["version"])
        raise PriceConfigError(
            f"{path}: version (line {line}): {table.version!r} does not match the file name;"
            f" a table's file is <version>.yaml ({path.stem!r} here)"
        )
    return table


def load_price_tables(directory: Path = PRICE_DIR) -> dict[str, PriceTable]:
    """Every ``*.yaml`` table in ``directory`` by version; at least one must exist."""
    if not directory.is_dir():
        raise PriceConfigError(f"{directory}: not a directory of price tables")
    tables = {}
    for path in sorted(directory.glob("*.yaml")):
        table = load_price_table(path)
        tables[table.version] = table
    if not tables:
        raise PriceConfigError(f"{directory}: no price tables (*.yaml)")
    return tables


class PriceBook:
    """The loaded price tables; the latest one prices new work."""

    def __init__(self, tables: Mapping[str, PriceTable]) -> None:
        if not tables:
            raise ValueError("a price book needs at least one table")
        for version, table in tables.items():
            if version != table.version:
                raise ValueError(f"table {table.version!r} filed under {version!r}")
        self._tables = dict(sorted(tables.items()))

    @classmethod
    def load(cls, directory: Path = PRICE_DIR) -> PriceBook:
        return cls(load_price_tables(directory))

    def versions(self) -> list[str]:
        """All versions, oldest first."""
        return list(self._tables)

    def latest(self) -> PriceTable:
        """The table with the greatest version (versions are ISO dates)."""
        return self._tables[max(self._tables)]

    def get(self, version: str) -> PriceTable:
        try:
            return self._tables[version]
        except KeyError:
            raise NotFound("price table", version) from None

    def resolve(self, version: str, *, engine: str, model: str, own: Price | None) -> Price:
        """The price of a step on a pool of engine kind ``engine`` serving ``model``, for a
        run pinned to table ``version``: the pool's ``own`` price, else the table's, else
        unpriced (``Price.priced`` is false; see ``orchestrator_core.pricing``)."""
        return resolve_price(self.get(version), engine=engine, model=model, own=own)
