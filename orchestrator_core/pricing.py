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

A model that no entry matches is free when the table says ``unpriced: free`` (an explicit
configuration choice of the table, never a default: ``unpriced`` is required). When it says
``unpriced: refuse`` the model is *unpriced*: a step with a cost budget (``max_cost_usd`` on
its run or on itself) is refused (:class:`Unpriced`, ``PRICE_UNKNOWN``), since nothing could
be reserved against that budget; a step without one runs, and its cost is recorded as
``None`` (null), never as a silent 0.

A pool may carry its own price (``price:`` in ``pools.yaml``, one of the same pricing forms).
It wins over the table for every step that pool serves: it is the operator's statement about
their own engines, more specific than a glob over model names. :func:`resolve_price` applies
that order: the pool's own price, the table's first matching entry, the table's ``unpriced``
policy. :meth:`Price.describe` is what a step's provenance records of the price it ran at.

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

PriceKind = Literal["free", "tokens", "decode_seconds", "unpriced"]
UnpricedPolicy = Literal["refuse", "free"]

COST_DECIMALS = 9  # costs are rounded to 1e-9 USD
_VERSION_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TOP_KEYS = ("version", "unpriced", "entries")
PRICE_KEYS = (
    "free",
    "input_per_million_usd",
    "output_per_million_usd",
    "per_decode_second_usd",
)
_ENTRY_KEYS = ("engine", "model", *PRICE_KEYS)
_FORMS = "free: true, input_per_million_usd + output_per_million_usd, or per_decode_second_usd"


def round_usd(value: float) -> float:
    """``value`` rounded to 1e-9 USD; ``-0.0`` becomes ``0.0``."""
    return round(value, COST_DECIMALS) + 0.0


class Unpriced(OrchestratorError):
    """The engine's model has no price (no pool price, no table entry, and the table does not
    make such models free) where one is needed: under a cost budget."""

    code = "PRICE_UNKNOWN"

    def __init__(self, engine: str, model: str, price_table: str) -> None:
        super().__init__(
            f"no price for model {model!r} on engine {engine!r} in price table {price_table}"
            " nor on its pool; a step with a cost budget (max_cost_usd) needs one",
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
    """One price: free, per million tokens in/out, per second of decode, or none (unpriced:
    the model runs without a cost budget only, and what it costs is not known).

    Where it came from: ``pool_id`` is the pool whose own price it is (``pools.yaml``);
    otherwise ``entry_index`` is the index of the table entry it came from, ``None`` when the
    table's ``unpriced`` policy decided for a model that no entry matched.
    """

    kind: PriceKind
    input_per_million: float = 0.0
    output_per_million: float = 0.0
    per_second: float = 0.0
    entry_index: int | None = None
    pool_id: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("free", "tokens", "decode_seconds", "unpriced"):
            raise ValueError(f"unknown price kind {self.kind!r}")
        if self.kind == "unpriced" and self.pool_id is not None:
            raise ValueError("a pool's own price is a price, never unpriced")
        rates = {
            "input_per_million": self.input_per_million,
            "output_per_million": self.output_per_million,
            "per_second": self.per_second,
        }
        used = {
            "free": (),
            "tokens": ("input_per_million", "output_per_million"),
            "decode_seconds": ("per_second",),
            "unpriced": (),
        }[self.kind]
        for name, rate in rates.items():
            if not math.isfinite(rate) or rate < 0:
                raise ValueError(f"{name} must be a finite number >= 0, not {rate!r}")
            if name not in used and rate != 0:
                raise ValueError(f"a {self.kind} price has no {name}")

    @property
    def priced(self) -> bool:
        """Whether what a generation costs is known (free counts as known: 0)."""
        return self.kind != "unpriced"

    def charge(self, tokens_in: int, tokens_out: int, decode_seconds: float) -> float | None:
        """What a generation is recorded as costing: :meth:`cost`, or ``None`` when unpriced
        (the cost is not known, which is not the same as 0)."""
        if not self.priced:
            _usage_count(tokens_in, "tokens_in")
            _usage_count(tokens_out, "tokens_out")
            _usage_seconds(decode_seconds, "decode_seconds")
            return None
        return self.cost(tokens_in, tokens_out, decode_seconds)

    def cost(self, tokens_in: int, tokens_out: int, decode_seconds: float) -> float:
        """USD for one generation, rounded to 1e-9. Inputs the price form ignores still must
        be valid (integers / finite, ``>= 0``). An unpriced model has no cost: ``ValueError``
        (record it with :meth:`charge`)."""
        tokens_in = _usage_count(tokens_in, "tokens_in")
        tokens_out = _usage_count(tokens_out, "tokens_out")
        decode_seconds = _usage_seconds(decode_seconds, "decode_seconds")
        if not self.priced:
            raise ValueError("an unpriced model has no cost; charge() records it as None")
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
        no time bound) or unknown (unpriced)."""
        tokens_in = _usage_count(tokens_in, "tokens_in")
        tokens_out = _usage_count(tokens_out, "tokens_out")
        if max_seconds is not None:
            max_seconds = _usage_seconds(max_seconds, "max_seconds")
        if not self.priced:
            return None
        if self.kind == "decode_seconds":
            if max_seconds is None:
                return None
            return round_usd(max_seconds * self.per_second)
        return self.cost(tokens_in, tokens_out, 0.0)

    def rates(self) -> dict[str, Any]:
        """The price in the form it is written in a table or ``pools.yaml`` (empty when
        unpriced)."""
        if self.kind == "free":
            return {"free": True}
        if self.kind == "tokens":
            return {
                "input_per_million_usd": self.input_per_million,
                "output_per_million_usd": self.output_per_million,
            }
        if self.kind == "decode_seconds":
            return {"per_decode_second_usd": self.per_second}
        return {}

    def describe(self) -> dict[str, Any]:
        """What a step's provenance records of its price: where it came from (``source``:
        ``pool``, ``table`` or ``unpriced``) and the rates it was charged at. A table price
        names its entry (``None``: the table's ``unpriced: free`` policy); the version of
        the table is the provenance's ``price_table``."""
        if not self.priced:
            return {"source": "unpriced"}
        if self.pool_id is not None:
            return {"source": "pool", "pool_id": self.pool_id, **self.rates()}
        return {"source": "table", "entry": self.entry_index, **self.rates()}


UNPRICED = Price("unpriced")


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


def parse_price(
    raw: Mapping[str, Any],
    *,
    path: str,
    entry_index: int | None = None,
    pool_id: str | None = None,
) -> Price:
    """The price written in ``raw`` (its pricing keys; other keys are the caller's): exactly
    one form of ``free: true``, ``input_per_million_usd`` with ``output_per_million_usd``, or
    ``per_decode_second_usd``. :class:`InvalidParams` names ``path`` or ``path.<key>``."""
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

    if forms[0] == "free":
        if raw["free"] is not True:
            raise InvalidParams(
                "must be true (omit it and give prices for a priced model)",
                field=f"{path}.free",
            )
        return Price("free", entry_index=entry_index, pool_id=pool_id)
    if forms[0] == "tokens":
        for key, other in (
            ("input_per_million_usd", "output_per_million_usd"),
            ("output_per_million_usd", "input_per_million_usd"),
        ):
            if key not in raw:
                raise InvalidParams(f"required together with {other}", field=f"{path}.{key}")
        return Price(
            "tokens",
            input_per_million=_rate(raw, "input_per_million_usd", path),
            output_per_million=_rate(raw, "output_per_million_usd", path),
            entry_index=entry_index,
            pool_id=pool_id,
        )
    return Price(
        "decode_seconds",
        per_second=_rate(raw, "per_decode_second_usd", path),
        entry_index=entry_index,
        pool_id=pool_id,
    )


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
    price = parse_price(raw, path=path, entry_index=index)
    return PriceEntry(engine=engine, model=model, price=price)


_FOUND_MAX = 1024


@dataclass(frozen=True)
class PriceTable:
    version: str
    unpriced: UnpricedPolicy
    entries: tuple[PriceEntry, ...]
    source: str = field(default="", compare=False)
    # (engine, model) -> the first entry matching, or None: a table never changes, and every
    # submission looks its model up (a glob per entry)
    _found: dict[tuple[str, str], PriceEntry | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

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
        key = (engine, model)
        try:
            return self._found[key]
        except KeyError:
            pass
        entry = next((e for e in self.entries if e.matches(engine, model)), None)
        if len(self._found) < _FOUND_MAX:  # models named by clients: bounded
            self._found[key] = entry
        return entry

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


def resolve_price(table: PriceTable, *, engine: str, model: str, own: Price | None = None) -> Price:
    """The price a step of ``model`` on a pool of engine kind ``engine`` runs at: the pool's
    own price (``own``) when it has one, else the table's; :data:`UNPRICED` when neither
    prices it and the table does not make such models free. Never raises :class:`Unpriced`:
    whether an unpriced model may run is the budget's question (``budgets.require_price``).
    """
    if own is not None:
        return own
    try:
        return table.price_for(engine, model)
    except Unpriced:
        return UNPRICED
