"""Price tables: what a generation on an engine's model costs, in USD.

A table is plain data (a dict, e.g. parsed from YAML by ``orchestratord.prices``)::

    version: "2026-11-01"
    unpriced: refuse          # refuse | free: what a model that no entry matches gets
    entries:
      - engine: sim           # the adapter kind of the pool: sim | llama | openai | ...
        model: "*"            # glob (fnmatch.fnmatchcase) over the model the engine reports
        free: true
      - engine: llama
        model: "Gemma 3 270m"
        per_decode_second_usd: 0.00001
      - engine: openai
        model: "gpt-4o-mini*"
        input_per_million_usd: 0.15
        output_per_million_usd: 0.60

Each entry has exactly one pricing form: ``free: true``; ``input_per_million_usd`` with
``output_per_million_usd`` (per million tokens, both required together); or
``per_decode_second_usd`` (per second of decode, for local engines). All prices are finite
and ``>= 0``. The first entry whose engine equals the engine kind and whose model glob
matches the model name wins; order entries from specific to general.

``engine`` is the adapter *kind* (``WorkerAdapter.kind``, the pool's ``engine``), not the
``engine`` field of the capabilities (the llama adapter reports ``llama.cpp`` there).

A model that no entry matches is refused (:class:`Unpriced`, ``PRICE_UNKNOWN``) when the
table says ``unpriced: refuse``, or is free when it says ``unpriced: free`` — an explicit
configuration choice of the table, never a default: ``unpriced`` is required.

Costs are rounded to the nearest 1e-9 USD (``round(x, 9)``), so equal inputs give equal
floats and sums of recorded costs do not carry binary noise below a nano-dollar.

Versions are ISO dates (``YYYY-MM-DD``), so the greatest version string is the latest table.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from orchestrator_core.errors import InvalidParams, OrchestratorError

PriceKind = Literal["free", "tokens", "decode_seconds"]
UnpricedPolicy = Literal["refuse", "free"]

COST_DECIMALS = 9  # costs are rounded to 1e-9 USD
_VERSION_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TOP_KEYS = ("version", "unpriced", "entries")
_ENTRY_KEYS = (
    "engine",
    "model",
    "free",
    "input_per_million_usd",
    "output_per_million_usd",
    "per_decode_second_usd",
)
_FORMS = "free: true, input_per_million_usd + output_per_million_usd, or per_decode_second_usd"


def round_usd(value: float) -> float:
    """``value`` rounded to 1e-9 USD; ``-0.0`` becomes ``0.0``."""
    return round(value, COST_DECIMALS) + 0.0


class Unpriced(OrchestratorError):
    """No entry of the price table covers the engine's model and the table refuses those."""

    code = "PRICE_UNKNOWN"

    def __init__(self, engine: str, model: str, price_table: str) -> None:
        super().__init__(
            f"no price for model {model!r} on engine {engine!r} in price table {price_table}"
            " (the table refuses unpriced models)",
            details={"engine": engine, "model": model, "price_table": price_table},
        )
        self.engine = engine
        self.model = model
        self.price_table = price_table


def _usage_count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParams("must be an integer >= 0", field=name)
    return value


def _usage_seconds(value: float, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidParams("must be a finite number >= 0", field=name)
    return float(value)


@dataclass(frozen=True)
class Price:
    """One price: free, per million tokens in/out, or per second of decode.

    ``entry_index`` is the index of the table entry it came from; ``None`` when the table's
    ``unpriced: free`` policy priced a model that no entry matched.
    """

    kind: PriceKind
    input_per_million: float = 0.0
    output_per_million: float = 0.0
    per_second: float = 0.0
    entry_index: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("free", "tokens", "decode_seconds"):
            raise ValueError(f"unknown price kind {self.kind!r}")
        rates = {
            "input_per_million": self.input_per_million,
            "output_per_million": self.output_per_million,
            "per_second": self.per_second,
        }
        used = {
            "free": (),
            "tokens": ("input_per_million", "output_per_million"),
            "decode_seconds": ("per_second",),
        }[self.kind]
        for name, rate in rates.items():
            if not math.isfinite(rate) or rate < 0:
                raise ValueError(f"{name} must be a finite number >= 0, not {rate!r}")
            if name not in used and rate != 0:
                raise ValueError(f"a {self.kind} price has no {name}")

    def cost(self, tokens_in: int, tokens_out: int, decode_seconds: float) -> float:
        """USD for one generation, rounded to 1e-9. Inputs the price form ignores still must
        be valid (integers / finite, ``>= 0``)."""
        tokens_in = _usage_count(tokens_in, "tokens_in")
        tokens_out = _usage_count(tokens_out, "tokens_out")
        decode_seconds = _usage_seconds(decode_seconds, "decode_seconds")
        if self.kind == "tokens":
            return round_usd(
                (tokens_in * self.input_per_million + tokens_out * self.output_per_million)
                / 1_000_000
            )
        if self.kind == "decode_seconds":
            return round_usd(decode_seconds * self.per_second)
        return 0.0

    def worst_case(
        self, tokens_in: int, tokens_out: int, max_seconds: float | None
    ) -> float | None:
        """The most a generation of at most ``tokens_in``/``tokens_out`` tokens and at most
        ``max_seconds`` of decode can cost; ``None`` when unbounded (a per-second price and
        no time bound)."""
        tokens_in = _usage_count(tokens_in, "tokens_in")
        tokens_out = _usage_count(tokens_out, "tokens_out")
        if max_seconds is not None:
            max_seconds = _usage_seconds(max_seconds, "max_seconds")
        if self.kind == "decode_seconds":
            if max_seconds is None:
                return None
            return round_usd(max_seconds * self.per_second)
        return self.cost(tokens_in, tokens_out, 0.0)


@dataclass(frozen=True)
class PriceEntry:
    engine: str
    model: str  # fnmatch glob, case-sensitive
    price: Price

    def matches(self, engine: str, model: str) -> bool:
        return engine == self.engine and fnmatch.fnmatchcase(model, self.model)


def _rate(entry: Mapping[str, Any], key: str, path: str) -> float:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParams(f"must be a number, not {type(value).__name__}", field=f"{path}.{key}")
    if not math.isfinite(value) or value < 0:
        raise InvalidParams("must be a finite number >= 0", field=f"{path}.{key}")
    return float(value)


def _unknown_keys(data: Mapping[Any, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            where = f"{prefix}{key}" if isinstance(key, str) else (prefix.rstrip(".") or "$")
            raise InvalidParams(f"unknown key {key!r} (allowed: {', '.join(allowed)})", field=where)


def _text(entry: Mapping[str, Any], key: str, path: str) -> str:
    if key not in entry:
        raise InvalidParams("required", field=f"{path}.{key}")
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise InvalidParams("must be a non-empty string", field=f"{path}.{key}")
    return value


def _parse_entry(raw: Any, index: int, engines: Collection[str] | None) -> PriceEntry:
    path = f"entries[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidParams("must be a mapping", field=path)
    _unknown_keys(raw, _ENTRY_KEYS, f"{path}.")
    engine = _text(raw, "engine", path)
    if engines is not None and engine not in engines:
        raise InvalidParams(
            f"unknown engine {engine!r} (known: {', '.join(sorted(engines))})",
            field=f"{path}.engine",
        )
    model = _text(raw, "model", path)

    forms = []
    if "free" in raw:
        forms.append("free")
    if "input_per_million_usd" in raw or "output_per_million_usd" in raw:
        forms.append("tokens")
    if "per_decode_second_usd" in raw:
        forms.append("decode_seconds")
    if not forms:
        raise InvalidParams(f"needs one pricing form: {_FORMS}", field=path)
    if len(forms) > 1:
        raise InvalidParams(
            f"has more than one pricing form; give exactly one of {_FORMS}", field=path
        )

    price: Price
    if forms[0] == "free":
        if raw["free"] is not True:
            raise InvalidParams(
                "must be true (omit it and give prices for a priced model)",
                field=f"{path}.free",
            )
        price = Price("free", entry_index=index)
    elif forms[0] == "tokens":
        for key, other in (
            ("input_per_million_usd", "output_per_million_usd"),
            ("output_per_million_usd", "input_per_million_usd"),
        ):
            if key not in raw:
                raise InvalidParams(f"required together with {other}", field=f"{path}.{key}")
        price = Price(
            "tokens",
            input_per_million=_rate(raw, "input_per_million_usd", path),
            output_per_million=_rate(raw, "output_per_million_usd", path),
            entry_index=index,
        )
    else:
        price = Price(
            "decode_seconds",
            per_second=_rate(raw, "per_decode_second_usd", path),
            entry_index=index,
        )
    return PriceEntry(engine=engine, model=model, price=price)


@dataclass(frozen=True)
class PriceTable:
    version: str
    unpriced: UnpricedPolicy
    entries: tuple[PriceEntry, ...]
    source: str = field(default="", compare=False)

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        source: str,
        engines: Collection[str] | None = None,
    ) -> PriceTable:
        """Validate ``data`` into a table; :class:`InvalidParams` names the first bad field
        (``version``, ``entries[2].input_per_million_usd``, ...) and carries ``source`` in
        its details. ``engines``, when given, is the set of engine kinds an entry may name."""
        try:
            return cls._parse(data, source=source, engines=engines)
        except InvalidParams as exc:
            exc.details.setdefault("source", source)
            raise

    @classmethod
    def _parse(cls, data: Any, *, source: str, engines: Collection[str] | None) -> PriceTable:
        if not isinstance(data, Mapping):
            raise InvalidParams("a price table must be a mapping", field="$")
        _unknown_keys(data, _TOP_KEYS, "")
        for key in _TOP_KEYS:
            if key not in data:
                raise InvalidParams("required", field=key)

        version = data["version"]
        if isinstance(version, dt.date):
            raise InvalidParams(
                f'must be a string; quote it: "{version.isoformat()}"', field="version"
            )
        if not isinstance(version, str) or not _VERSION_RE.match(version):
            raise InvalidParams('must be an ISO date string "YYYY-MM-DD"', field="version")
        try:
            dt.date.fromisoformat(version)
        except ValueError as exc:
            raise InvalidParams(f"{version!r} is not a calendar date", field="version") from exc

        unpriced = data["unpriced"]
        if unpriced not in ("refuse", "free"):
            raise InvalidParams(f"must be 'refuse' or 'free', not {unpriced!r}", field="unpriced")

        raw_entries = data["entries"]
        if not isinstance(raw_entries, list):
            raise InvalidParams("must be a list", field="entries")
        entries: list[PriceEntry] = []
        seen: dict[tuple[str, str], int] = {}
        for index, raw in enumerate(raw_entries):
            entry = _parse_entry(raw, index, engines)
            first = seen.setdefault((entry.engine, entry.model), index)
            if first != index:
                raise InvalidParams(
                    f"engine {entry.engine!r} with model {entry.model!r} repeats entries[{first}]"
                    " (the first match wins, so this entry is never used)",
                    field=f"entries[{index}].model",
                )
            entries.append(entry)
        return cls(
            version=version,
            unpriced=cast(UnpricedPolicy, unpriced),
            entries=tuple(entries),
            source=source,
        )

    def entry_for(self, engine: str, model: str) -> PriceEntry | None:
        """The first entry matching ``engine`` exactly and ``model`` by glob, if any."""
        return next((e for e in self.entries if e.matches(engine, model)), None)

    def price_for(self, engine: str, model: str) -> Price:
        """The price of ``model`` on engine kind ``engine``.

        No entry matches: ``unpriced: free`` gives a free price with ``entry_index=None``;
        ``unpriced: refuse`` raises :class:`Unpriced`.
        """
        entry = self.entry_for(engine, model)
        if entry is not None:
            return entry.price
        if self.unpriced == "free":
            return Price("free", entry_index=None)
        raise Unpriced(engine, model, self.version)
