"""The engine variants: adding an engine is one module and one line in ``ENGINES`` below.

An engine's module defines its adapter (a :class:`~worker_adapters.base.WorkerAdapter`) and
``VARIANT``, an :class:`EngineVariant` saying what a pool of it accepts and how a replica's
adapter is built:

- ``options``: a pydantic model of the replica's ``options`` (``extra="forbid"``, every
  field described). The pools file is checked against it, and errors name
  ``replicas.N.options.FIELD``.
- ``url``: the :class:`UrlForms` a replica's ``url`` takes (required or not, examples shown
  in errors, the address the adapter dials); ``None``: the engine takes no url.
- ``slots``: the one slot count a replica may have, and why (``None``: any).
- ``tokenizer``: who tokenizes prompts: ``"engine"``, or ``"control_plane"`` for engines that
  take raw token ids (the replica names its vocabulary with ``options.tokenizer``).
- ``build``: the factory, from the replica, its typed options and the defaults the
  service's settings give (:class:`EngineDefaults`). It may import the engine library
  lazily.

Whether the engine keeps a run's conversation in a session (``session_bound``) and its name
are the adapter class's own. A module is imported when its engine is first looked up, so
naming the engines costs nothing. Nothing here imports the service: what a factory needs
from the settings is passed as plain values.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from worker_adapters.base import WorkerAdapter

# One line per engine: its name and the module that defines its VARIANT.
ENGINES: dict[str, str] = {
    "sim": "worker_adapters.sim",
    "llama": "worker_adapters.llama",
    "openai": "worker_adapters.openai",
    "kakeya": "worker_adapters.kakeya",
    "salience": "worker_adapters.salience",
    "uma": "worker_adapters.uma",
    "evergreen": "worker_adapters.evergreen",
}

Options = TypeVar("Options", bound=BaseModel)


@dataclass(frozen=True)
class EngineDefaults:
    """What the service's settings give the factories."""

    sim_tokens_per_s: float = 50.0
    sim_eos_probability: float = 0.02
    llama_model_path: Path | None = None  # None: the packaged model
    # what an engine may send (the settings' engine_limits): the adapters that read bytes
    # stop reading a stream line, or an error body, past these
    max_token_bytes: int = 64 << 10
    max_error_bytes: int = 64 << 10


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica of a pool, as its factory sees it."""

    replica_id: str
    url: str | None  # as written in the pools file
    address: str | None  # what the adapter dials: ``url`` read by the engine's UrlForms
    model: str | None
    slots: int

    @property
    def required_address(self) -> str:
        """``address``, for an engine whose replicas need a url (the pools file refuses a
        replica of it without one)."""
        assert self.address is not None  # the pools file requires a url
        return self.address


def _as_written(url: str) -> str:
    return url


@dataclass(frozen=True)
class UrlForms:
    """What a replica's ``url`` is to an engine."""

    needs: str  # "its gRPC address as url", shown as "a kakeya replica needs ..."
    examples: tuple[str, ...]  # shown in errors
    # the address the adapter dials; raises ValueError for a url of no accepted form
    address: Callable[[str], str] = _as_written
    required: bool = True


@dataclass(frozen=True)
class EngineVariant(Generic[Options]):
    adapter: type[WorkerAdapter]
    options: type[Options]
    build: Callable[[ReplicaConfig, Options, EngineDefaults], WorkerAdapter]
    url: UrlForms | None = None
    slots: tuple[int, str] | None = None  # (the one slot count a replica may have, why)
    tokenizer: Literal["engine", "control_plane"] = "engine"

    @property
    def name(self) -> str:
        return self.adapter.kind

    @property
    def session_bound(self) -> bool:
        return self.adapter.session_bound

    @property
    def local(self) -> bool:
        """A replica of it needs no url: it can be the one local pool (``--engine``)."""
        return self.url is None or not self.url.required

    def url_error(self, url: str | None) -> str | None:
        """What is wrong with a replica's ``url``, or None."""
        if self.url is None:
            return None
        if not url:
            if not self.url.required:
                return None
            article = "an" if self.name[:1] in "aeiou" else "a"
            example = " or ".join(self.url.examples)
            return f"{article} {self.name} replica needs {self.url.needs}, e.g. {example}"
        try:
            self.url.address(url)
        except ValueError as exc:
            return str(exc)
        return None

    def address(self, url: str | None) -> str | None:
        """What the adapter dials for a replica's ``url``."""
        return self.url.address(url) if url and self.url is not None else url

    def slots_error(self, slots: int) -> str | None:
        if self.slots is None or slots == self.slots[0]:
            return None
        count, why = self.slots
        said = "one slot" if count == 1 else f"{count} slots"
        return f"a {self.name} replica has exactly {said} ({why})"

    def parse_options(self, raw: dict[str, Any]) -> Options:
        """The typed options; a ValidationError names each bad field (an unknown one is
        refused with the engine's options)."""
        try:
            return self.options.model_validate(raw)
        except ValidationError as exc:
            title = self.options.__name__
            raise ValidationError.from_exception_data(title, self._named(exc, ())) from None

    def option_errors(
        self, raw: dict[str, Any], *, at: tuple[str | int, ...]
    ) -> list[InitErrorDetails]:
        """What is wrong with ``raw`` as this engine's options, each error at ``at`` + its
        field (a pools file: ``("replicas", N, "options")``)."""
        try:
            self.options.model_validate(raw)
        except ValidationError as exc:
            return self._named(exc, at)
        return []

    def _named(self, exc: ValidationError, at: tuple[str | int, ...]) -> list[InitErrorDetails]:
        known = ", ".join(self.options.model_fields) or "none"
        errors: list[InitErrorDetails] = []
        for err in exc.errors():
            message = err["msg"]
            if err["type"] == "extra_forbidden":
                message = f"{self.name} has no such option (its options: {known})"
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError(err["type"], message),
                    loc=(*at, *err["loc"]),
                    input=err["input"],
                )
            )
        return errors

    def adapter_for(
        self, replica: ReplicaConfig, options: dict[str, Any], defaults: EngineDefaults
    ) -> WorkerAdapter:
        return self.build(replica, self.parse_options(options), defaults)


def variant(name: str) -> EngineVariant[Any]:
    """The variant registered as ``name`` (its module is imported on first use)."""
    module = importlib.import_module(ENGINES[name])
    found: EngineVariant[Any] = module.VARIANT
    if found.name != name:
        raise LookupError(f"{ENGINES[name]} defines engine {found.name!r}, registered as {name!r}")
    return found


def variants() -> list[EngineVariant[Any]]:
    return [variant(name) for name in ENGINES]


def local_engines() -> list[str]:
    """The engines that can be the one local pool: their replicas need no url."""
    return [v.name for v in variants() if v.local]


def runs_locally(name: str) -> bool:
    """``name`` is a registered engine whose replica needs no url (imports that one only)."""
    return name in ENGINES and variant(name).local
