"""Requests described without doing I/O, so the blocking and the async client share them.

A route is written once, as a function from its arguments to a :class:`Call` (what to send
and how to read the answer), and put on the clients' shared route table as an
:class:`Operation`. Read through a :class:`~orchestrator_client.client.Client` the operation
is a method answering ``T``; through an :class:`~orchestrator_client.client.AsyncClient`, a
coroutine method answering ``T``. Type checkers see both (the descriptor's ``__get__`` is
overloaded on the client's kind).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload
from urllib.parse import quote

from pydantic import BaseModel, TypeAdapter, ValidationError

from orchestrator_client.errors import InvalidRequest

if TYPE_CHECKING:
    from orchestrator_client.transport import AsyncTransport, SyncTransport

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")

Read = Callable[[bytes], T]


def new_token() -> str:
    """A fresh ``client_token``: a retry of a write sends the same one, a new write a new one."""
    return uuid.uuid4().hex


def model(kind: type[M]) -> Read[M]:
    return kind.model_validate_json


def items(kind: type[M]) -> Read[list[M]]:
    return TypeAdapter(list[kind]).validate_json  # type: ignore[valid-type]


def nothing(_: bytes) -> None:
    return None


def text(body: bytes) -> str:
    return body.decode()


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request: the route's arguments filled in, the body ready, and how to read the
    answer. Every route is safe to send again: a read, a write that carries a
    ``client_token``, or a write idempotent by its nature (a flow is its content, a pool
    its body, a cancel or a drain a state)."""

    read: Read[T]
    path: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str | int | None] = field(default_factory=dict)
    body: Any = None
    method: str = ""
    route: str = ""

    @property
    def url(self) -> str:
        return filled(self.route, self.path)


def filled(route: str, path: Mapping[str, str]) -> str:
    """``route`` with its ``{names}`` replaced by ``path``'s values, each one path segment
    (``/`` and the rest quoted)."""
    return route.format_map({k: quote(v, safe="") for k, v in path.items()})


class Operation(Generic[P, T]):
    """A route of the API, bound to a client on attribute access."""

    def __init__(self, method: str, route: str, build: Callable[P, Call[T]]) -> None:
        self.method = method
        self.route = route
        self.build = build
        self.__doc__ = build.__doc__

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call[T]:
        built = self.build(*args, **kwargs)
        return Call(
            read=built.read,
            path=built.path,
            query={k: v for k, v in built.query.items() if v is not None},
            body=built.body,
            method=self.method,
            route=self.route,
        )

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Operation[P, T]: ...

    @overload
    def __get__(self, client: SyncTransport, owner: type[Any]) -> Callable[P, T]: ...

    @overload
    def __get__(self, client: AsyncTransport, owner: type[Any]) -> Callable[P, Awaitable[T]]: ...

    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self

        @functools.wraps(self.build)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return client.send(self.call(*args, **kwargs))

        return bound


def route(method: str, path: str) -> Callable[[Callable[P, Call[T]]], Operation[P, T]]:
    """Make a route of a function that builds its :class:`Call`."""

    def make(build: Callable[P, Call[T]]) -> Operation[P, T]:
        return Operation(method, path, build)

    return make


def body_of(value: BaseModel | Mapping[str, Any], kind: type[M]) -> M:
    """A request body as the contract's model: a model is taken as is, a mapping is
    validated (:class:`InvalidRequest` names each wrong field before anything is sent)."""
    if isinstance(value, kind):
        return value
    try:
        return kind.model_validate(value)
    except ValidationError as exc:
        raise InvalidRequest.of(exc) from None


def tokened(value: M) -> M:
    """The body with a ``client_token`` (a new one when it has none), so a retry is safe."""
    if getattr(value, "client_token", None) is None:
        return value.model_copy(update={"client_token": new_token()})
    return value


def dump(value: BaseModel) -> Any:
    return value.model_dump(mode="json", by_alias=True, exclude_unset=False)
