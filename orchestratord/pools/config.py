"""The pools file (YAML) and the single local pool of ``--engine``.

Errors name the field and, for a file, the line it is on.

A pool may carry its own price (``price:``), written as a price-table entry is, without
``engine`` and ``model``: ``{free: true}``, ``{input_per_million_usd: ..,
output_per_million_usd: ..}`` or ``{per_decode_second_usd: ..}``, amounts in USD, finite and
``>= 0``. It wins over the price table for every step the pool serves (see
``orchestrator_core.pricing``).

What a replica takes (``url``, ``slots``, ``options``) is its engine's, as the engine's
variant says (``worker_adapters.registry``): errors name ``replicas.N.options.FIELD``.

Hardware is declared, as engines do not report it: ``gpu: {arch, vram_gib, count}`` on a
replica says what each of its engine's processes runs on (``count`` GPUs of ``vram_gib`` GiB
each, an integer; ``arch`` as the operator names it: ``sm90``, ``gfx942``, ``h100``). Written
on the pool, it is what every replica that declares none runs on. ``vendor``, ``name`` and
``driver`` may be added; ``vendor`` is otherwise read from ``arch`` (``sm..``: nvidia,
``gfx..``: amd, else unknown). Each GPU is named ``<pool_id>/<replica_id>/gpu<N>`` (``N``
from 0): the ids the capability snapshot lists and placement selectors name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from orchestrator_core.errors import InvalidParams
from orchestrator_core.pricing import Price, parse_price
from orchestratord.yaml_files import line_of, read_yaml
from worker_adapters.registry import ENGINES, variant


def _registered(name: str) -> str:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} (known: {', '.join(sorted(ENGINES))})")
    return name


EngineName = Annotated[str, AfterValidator(_registered)]


def _vendor_of(arch: str) -> str:
    lowered = arch.lower()
    if re.fullmatch(r"sm_?\d+[a-z]?", lowered):
        return "nvidia"
    if re.fullmatch(r"gfx\d+[a-z]?", lowered):
        return "amd"
    return "unknown"


class GpuSpec(BaseModel):
    """The GPUs one replica's engine runs on, as the operator declares them."""

    model_config = ConfigDict(extra="forbid")
    arch: str = Field(min_length=1, max_length=64, description="sm90, gfx942, h100, ...")
    vram_gib: int = Field(ge=1, le=65536, strict=True, description="memory of each GPU, GiB")
    count: int = Field(default=1, ge=1, le=1024, strict=True, description="GPUs of the replica")
    vendor: str | None = Field(
        default=None, min_length=1, max_length=64, description="default: read from arch"
    )
    name: str | None = Field(default=None, min_length=1, max_length=128)
    driver: str | None = Field(default=None, min_length=1, max_length=64)

    @property
    def vendor_name(self) -> str:
        return self.vendor or _vendor_of(self.arch)

    @property
    def display_name(self) -> str:
        return self.name or f"{self.arch} {self.vram_gib} GiB"

    def shown(self) -> dict[str, Any]:
        """As ``GET /v1/pools`` shows it."""
        return {"arch": self.arch, "vram_gib": self.vram_gib, "count": self.count}


def gpu_ids(pool_id: str, replica_id: str, gpu: GpuSpec | None) -> tuple[str, ...]:
    """The ids of a replica's GPUs: ``<pool_id>/<replica_id>/gpu<N>``."""
    return () if gpu is None else tuple(f"{pool_id}/{replica_id}/gpu{n}" for n in range(gpu.count))


class ReplicaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replica_id: str = Field(min_length=1, max_length=128)
    url: str | None = None
    model: str | None = None
    slots: int = Field(default=1, ge=1, le=4096)
    options: dict[str, Any] = Field(default_factory=dict)
    gpu: GpuSpec | None = Field(default=None, description="its GPUs; default: the pool's gpu")


def _usd(description: str) -> Any:
    return Field(default=None, ge=0, allow_inf_nan=False, strict=True, description=description)


class PoolPrice(BaseModel):
    """A pool's own price: one pricing form of a price-table entry."""

    model_config = ConfigDict(extra="forbid")
    free: bool | None = Field(default=None, strict=True, description="true: costs nothing")
    input_per_million_usd: float | None = _usd("USD per million prompt tokens")
    output_per_million_usd: float | None = _usd("USD per million generated tokens")
    per_decode_second_usd: float | None = _usd("USD per second of decode")

    @model_validator(mode="after")
    def _one_form(self) -> PoolPrice:
        self.to_price()  # the forms' rules are the price tables'
        return self

    def to_price(self, pool_id: str | None = None) -> Price:
        try:
            return parse_price(self.model_dump(exclude_none=True), path="$", pool_id=pool_id)
        except InvalidParams as exc:
            where = exc.field.removeprefix("$").removeprefix(".")
            message = exc.message.removeprefix(f"{exc.field}: ")
            raise ValueError(f"{where}: {message}" if where else message) from None


class PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    engine: EngineName
    tags: dict[str, str] = Field(default_factory=dict)
    replicas: list[ReplicaSpec] = Field(min_length=1)
    price: PoolPrice | None = Field(
        default=None, description="the pool's own price; it wins over the price table"
    )
    gpu: GpuSpec | None = Field(
        default=None, description="the GPUs of each replica that declares none of its own"
    )

    def gpu_of(self, replica: ReplicaSpec) -> GpuSpec | None:
        """What ``replica`` runs on: its own declaration, else the pool's."""
        return replica.gpu or self.gpu

    def own_price(self) -> Price | None:
        return None if self.price is None else self.price.to_price(self.pool_id)

    @model_validator(mode="after")
    def _replicas_fit_the_engine(self) -> PoolSpec:
        ids = [r.replica_id for r in self.replicas]
        if len(ids) != len(set(ids)):
            raise ValueError("replica_id values must be unique within a pool")
        engine = variant(self.engine)
        errors: list[InitErrorDetails] = []  # each named where it is: replicas.N.FIELD
        for i, replica in enumerate(self.replicas):
            for field, wrong, value in (
                ("slots", engine.slots_error(replica.slots), replica.slots),
                ("url", engine.url_error(replica.url), replica.url),
            ):
                if wrong:
                    errors.append(_at(("replicas", i, field), wrong, value))
            errors += engine.option_errors(replica.options, at=("replicas", i, "options"))
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


def _at(loc: tuple[str | int, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)


class PoolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pools: list[PoolSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_pools(self) -> PoolsFile:
        ids = [p.pool_id for p in self.pools]
        if len(ids) != len(set(ids)):
            raise ValueError("pool_id values must be unique")
        return self


class PoolConfigError(ValueError):
    pass


def load_pools_file(path: Path) -> list[PoolSpec]:
    node, data = read_yaml(path, PoolConfigError)
    try:
        return PoolsFile.model_validate(data).pools
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
            where = ".".join(str(p) for p in loc) or "(top level)"
            line = line_of(node, loc)
            at = f" (line {line})" if line else ""
            lines.append(f"{path}: {where}{at}: {err['msg']}")
        raise PoolConfigError("\n".join(lines)) from exc


def local_pool(engine: str, *, slots: int) -> list[PoolSpec]:
    fixed = variant(engine).slots
    return [
        PoolSpec(
            pool_id="local",
            engine=engine,
            tags={"location": "local"},
            replicas=[ReplicaSpec(replica_id="r0", slots=slots if fixed is None else fixed[0])],
        )
    ]
