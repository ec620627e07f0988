"""A small synchronous client of the v1 API (``orchctl`` and scripts use it).

It speaks only HTTP and JSON: it imports nothing of the server, so it runs wherever ``httpx``
does. Errors are raised as :class:`ApiError` (the server answered with an error body) or
:class:`Unreachable` (no answer); both are :class:`ClientError`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import httpx

from orchestrator_client import __version__

JsonObject = dict[str, Any]
TERMINAL_EVENTS = frozenset({"end", "error"})


class ClientError(Exception):
    """Anything that kept a request from getting a successful answer."""

    code: str
    message: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ApiError(ClientError):
    """The server answered with an error; ``body`` is its error body."""

    def __init__(self, status: int, body: JsonObject) -> None:
        super().__init__(str(body.get("code") or f"HTTP_{status}"), str(body.get("message", "")))
        self.status = status
        self.body = body

    @property
    def details(self) -> JsonObject:
        details = self.body.get("details")
        return details if isinstance(details, dict) else {}

    @property
    def correlation_id(self) -> str | None:
        value = self.body.get("correlation_id")
        return value if isinstance(value, str) else None

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "code" not in body:
            text = response.text.strip()[:500] or response.reason_phrase
            body = {"code": f"HTTP_{response.status_code}", "message": text, "details": {}}
        body.setdefault("correlation_id", response.headers.get("x-correlation-id"))
        return cls(response.status_code, body)


class Unreachable(ClientError):
    """No answer: connection refused, timed out, or a stream that kept dropping."""

    def __init__(self, message: str) -> None:
        super().__init__("UNREACHABLE", message)


# --- Server-Sent Events ---------------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: ``id`` is the last event id in force when it was dispatched."""

    event: str
    data: str
    id: str | None = None

    def json(self) -> JsonObject:
        value = json.loads(self.data)
        if not isinstance(value, dict):
            raise ValueError(f"event {self.event!r} data is not a JSON object: {self.data[:80]!r}")
        return value


@dataclass
class SseParser:
    """Incremental SSE parser (the WHATWG rules): feed it lines without their line ending.

    Comment lines (``: keep-alive``) are counted but produce no event; ``data:`` lines of one
    event are joined with newlines; an event is dispatched at the blank line after it.
    """

    last_event_id: str | None = None
    retry_ms: int | None = None
    comments: int = 0
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None  # unknown fields are ignored

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent(event=event or "message", data="\n".join(data), id=self.last_event_id)


def parse_sse(text: str) -> list[SseEvent]:
    """Every complete event of an SSE body (an unterminated last event is dropped)."""
    parser = SseParser()
    events = []
    for line in text.removeprefix("\ufeff").splitlines():
        event = parser.feed(line)
        if event is not None:
            events.append(event)
    return events


# --- the client -----------------------------------------------------------------------------


class Client:
    """Blocking client of one orchestratord server.

    ``timeout`` bounds every wait for the server, including the silence between two events
    (or keep-alives) of a stream; a stream that drops is resumed with ``Last-Event-ID`` up to
    ``max_reconnects`` times in a row.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        max_reconnects: int = 5,
        reconnect_delay_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_reconnects = max_reconnects
        self.reconnect_delay_s = reconnect_delay_s
        headers = {"User-Agent": f"orchctl/{__version__}"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            headers=headers,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, json_body: Any = None) -> Any:
        try:
            response = self._http.request(method, path, json=json_body)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{method} {self.base_url}{path}: {_describe(exc)}") from exc
        if response.status_code >= 400:
            raise ApiError.from_response(response)
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                response.status_code,
                {"code": "BAD_RESPONSE", "message": f"{method} {path}: not JSON: {exc}"},
            ) from exc

    def _object(self, method: str, path: str, *, json_body: Any = None) -> JsonObject:
        value = self._request(method, path, json_body=json_body)
        if not isinstance(value, dict):
            raise ApiError(200, {"code": "BAD_RESPONSE", "message": f"{path}: not an object"})
        return value

    # flows, runs and steps

    def create_flow(self, body: JsonObject) -> JsonObject:
        """``POST /v1/flows`` (``{"ast", "tools", "config", "labels"}``): the same content
        answers the same ``flow_id``."""
        return self._object("POST", "/v1/flows", json_body=body)

    def get_run(self, run_id: str) -> JsonObject:
        return self._object("GET", f"/v1/runs/{run_id}")

    def create_run(self, flow_id: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/v1/flows/{flow_id}/runs", json_body=body)

    def list_steps(self, run_id: str) -> list[JsonObject]:
        value = self._request("GET", f"/v1/runs/{run_id}/steps")
        if not isinstance(value, list):
            raise ApiError(200, {"code": "BAD_RESPONSE", "message": "steps: not a list"})
        return sorted(value, key=lambda s: int(s["position"]))

    def submit_step(self, run_id: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/v1/runs/{run_id}/steps", json_body=body)

    def get_step(self, step_id: str) -> JsonObject:
        return self._object("GET", f"/v1/steps/{step_id}")

    def replay_report(self, run_id: str) -> JsonObject:
        return self._object("GET", f"/v1/runs/{run_id}/replay-report")

    def export_run(self, run_id: str) -> JsonObject:
        return self._object("GET", f"/v1/runs/{run_id}/export")

    def import_run(self, bundle: JsonObject) -> JsonObject:
        return self._object("POST", "/v1/runs:import", json_body=bundle)

    # streams

    def follow_step(self, step_id: str, *, last_event_id: str | None = None) -> Iterator[SseEvent]:
        """The step's events to its ``end`` or ``error``, resuming after a dropped connection.

        Raises :class:`ApiError` when the server refuses the stream (unknown step) and
        :class:`Unreachable` when it cannot be resumed.
        """
        path = f"/v1/steps/{step_id}/stream"
        failures = 0
        delay_s = self.reconnect_delay_s
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id is not None:
                headers["Last-Event-ID"] = last_event_id
            parser = SseParser(last_event_id=last_event_id)
            try:
                with self._http.stream("GET", path, headers=headers) as response:
                    if response.status_code != 200:
                        response.read()
                        raise ApiError.from_response(response)
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        failures = 0  # the server is talking: keep-alives count
                        if event is None:
                            continue
                        last_event_id = event.id
                        yield event
                        if event.event in TERMINAL_EVENTS:
                            return
                reason = "the stream closed before the step's end"
            except httpx.HTTPError as exc:
                reason = _describe(exc)
            failures += 1
            if failures > self.max_reconnects:
                raise Unreachable(f"GET {self.base_url}{path}: {reason} (gave up resuming)")
            if parser.retry_ms is not None:
                delay_s = parser.retry_ms / 1000
            time.sleep(delay_s)
            delay_s = min(max(delay_s * 2, 0.05), 5.0)


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"


# --- replaying a recorded run ---------------------------------------------------------------


@dataclass(frozen=True)
class StepReplay:
    """How one re-submitted step ended, as its stream told it."""

    position: int
    recorded_step_id: str
    step_id: str | None
    tokens: int
    ended: str | None = None
    """``stop_reason`` of the ``end`` event."""
    error: JsonObject | None = None
    """The ``error`` event's body, or the refusal of the submission."""

    @property
    def outcome(self) -> str:
        if self.error is None:
            return f"end ({self.ended})"
        code = str(self.error.get("code", "ERROR"))
        details = self.error.get("details") or {}
        divergence = details.get("divergence") if isinstance(details, dict) else None
        if code == "REPLAY_DIVERGED" and isinstance(divergence, dict):
            return f"{code} at token {divergence.get('token_index')}"
        differs = details.get("differs") if isinstance(details, dict) else None
        if code == "REPLAY_MISS" and isinstance(differs, list):
            return f"{code} (differs: {', '.join(map(str, differs))})"
        return code


def derived_input(document: JsonObject) -> dict[str, frozenset[str]]:
    """Per step type, the fields the server adds to a step's stored input (a plan's tool
    schemas and template, resolved from the flow when it was submitted), as an OpenAPI
    document tells them: the ``readOnly`` properties of the ``input`` of each step request
    (a schema whose ``type`` is a constant and whose ``input`` is a reference)."""
    schemas = document.get("components", {}).get("schemas", {})
    derived: dict[str, frozenset[str]] = {}
    for schema in schemas.values():
        properties = schema.get("properties") or {}
        step_type = (properties.get("type") or {}).get("const")
        ref = (properties.get("input") or {}).get("$ref")
        if not isinstance(step_type, str) or not isinstance(ref, str):
            continue
        target = schemas.get(ref.rsplit("/", 1)[-1]) or {}
        fields = frozenset(
            name
            for name, prop in (target.get("properties") or {}).items()
            if isinstance(prop, dict) and prop.get("readOnly") is True
        )
        if fields:
            derived[step_type] = fields
    return derived


@functools.cache
def contract_derived_input() -> dict[str, frozenset[str]]:
    """``derived_input`` of the contract this client ships with (``contracts/openapi.json``,
    package data), read on first use."""
    document = json.loads(resources.files("contracts").joinpath("openapi.json").read_text())
    return derived_input(document)


def replay_step_body(recorded: JsonObject) -> JsonObject:
    """The submission that repeats a recorded step (placement is the replay run's business):
    its stored input less what the server derived from it."""
    derived = contract_derived_input().get(str(recorded["type"]), frozenset())
    stored = recorded.get("input") or {}
    return {
        "type": recorded["type"],
        "client_token": recorded["client_token"],
        "input": {k: v for k, v in stored.items() if k not in derived},
        "budgets": recorded.get("budgets"),
        "placement": None,
        "priority": recorded.get("priority") or "interactive",
    }


def follow_to_end(client: Client, step_id: str) -> tuple[int, str | None, JsonObject | None]:
    """(tokens, stop_reason, error body) of a step, read from its stream."""
    seen: set[int] = set()
    for event in client.follow_step(step_id):
        if event.event == "token":
            seen.add(int(event.json().get("i", len(seen))))
        elif event.event == "end":
            data = event.json()
            return int(data.get("tokens_out", len(seen))), str(data.get("stop_reason")), None
        elif event.event == "error":
            return len(seen), None, event.json()
    raise Unreachable(f"the stream of {step_id} ended without an end or error event")


def submit_retrying(
    client: Client, run_id: str, body: JsonObject, *, attempts: int = 5
) -> JsonObject:
    """Submit, retrying refusals the server marks retriable (a full admission queue, no ready
    pool) after the wait it asks for, and lost connections (the server may have committed the
    step before the answer was lost); the same client_token makes a retry safe."""
    for attempt in range(attempts):
        try:
            return client.submit_step(run_id, body)
        except Unreachable:
            if attempt == attempts - 1:
                raise
            time.sleep(min(0.5 * 2**attempt, 5.0))
        except ApiError as exc:
            if not exc.body.get("retriable") or attempt == attempts - 1:
                raise
            wait_ms = exc.body.get("retry_after_ms")
            time.sleep(min(wait_ms / 1000 if isinstance(wait_ms, int) else 0.5, 10.0))
    raise AssertionError("unreachable")


def replay_run(
    client: Client,
    run_id: str,
    *,
    strict: bool = False,
    on_step: Callable[[StepReplay], None] | None = None,
) -> tuple[str, JsonObject]:
    """Replay a recorded run as an interpreter would; returns (replay run id, replay report).

    Creates a ``replay`` (``strict_replay``) run of the same flow with the recorded seed,
    re-submits the recorded steps in position order, one at a time, following each stream to
    its end before the next. A submission the server refuses (4xx) is reported to ``on_step``
    and the replay goes on; the report then says what was not replayed.
    """
    recorded = client.get_run(run_id)
    steps = client.list_steps(run_id)
    replay = client.create_run(
        str(recorded["flow_id"]),
        {
            "mode": "strict_replay" if strict else "replay",
            "source_run_id": run_id,
            "seed": recorded.get("seed"),
        },
    )
    replay_run_id = str(replay["run_id"])
    for step in steps:
        position, recorded_id = int(step["position"]), str(step["step_id"])
        try:
            accepted = submit_retrying(client, replay_run_id, replay_step_body(step))
        except ApiError as exc:
            if exc.status >= 500:
                raise
            result = StepReplay(position, recorded_id, None, 0, error=exc.body)
        else:
            step_id = str(accepted["step_id"])
            tokens, ended, error = follow_to_end(client, step_id)
            result = StepReplay(position, recorded_id, step_id, tokens, ended, error)
        if on_step is not None:
            on_step(result)
    return replay_run_id, client.replay_report(replay_run_id)
