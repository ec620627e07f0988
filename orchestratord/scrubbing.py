"""Where the secrets rule (``orchestrator_core.secrets``) meets what this service holds.

The configured secrets are those of the pools (each replica URL's credentials and what its
adapter sends on its own: an OpenAI-compatible replica's API key) and the database URL's
password. They are masked in:

- the pool listings (``GET /v1/pools``: replica URLs, health details, capabilities);
- every step's ending (its ``error`` event and the step's ``error``, which exports copy) and
  the events that carry an upstream party's words (``narration``, ``escalation``);
- log lines (``orchestratord.event_logging.scrub_logs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from contracts.events import ErrorEvent, EscalationEvent, EventBase, NarrationEvent
from contracts.records import PoolOut
from orchestrator_core.secrets import Scrubber, url_secrets
from orchestratord.steps.ending import Ending

if TYPE_CHECKING:
    from orchestratord.pools.registry import Pool, PoolRegistry


def scrubber_for(pools: PoolRegistry, *, urls: Iterable[str | None] = ()) -> Scrubber:
    """The scrubber that knows every secret the pools were configured with, and those
    written in ``urls`` (the database's)."""
    secrets: list[str] = [s for url in urls for s in url_secrets(url)]
    for pool in pools.pools.values():
        secrets += secrets_of(pool)
    return Scrubber(secrets)


def secrets_of(pool: Pool) -> list[str]:
    """The credentials a pool's replicas were configured with."""
    secrets: list[str] = []
    for replica in pool.replicas:
        secrets += url_secrets(replica.url)
        # an adapter lists the credentials it sends (an API key); most hold none
        held: Any = getattr(replica.adapter, "secrets", ())
        secrets += [s for s in held if isinstance(s, str)]
    return secrets


def scrub_pool(view: PoolOut, scrubber: Scrubber) -> PoolOut:
    """A pool as it may be shown: replica URLs, health details and capabilities scrubbed."""
    return view.model_copy(
        update={
            "capabilities": scrubber.value(view.capabilities),
            "provision": scrubber.value(view.provision),
            "replicas": [
                r.model_copy(
                    update={"url": scrubber.url(r.url), "health": scrubber.value(r.health)}
                )
                for r in view.replicas
            ],
        }
    )


def scrub_event(event: EventBase, scrubber: Scrubber) -> EventBase:
    """An event that may quote an upstream party (an error, a retry, a breaker's reason)
    with the secrets masked; any other event as it is (tokens, facts and outputs are the
    record, and are never rewritten)."""
    if isinstance(event, ErrorEvent):
        return _error_event(event, scrubber)
    if isinstance(event, NarrationEvent):
        return event.model_copy(update={"text": scrubber.text(event.text)})
    if isinstance(event, EscalationEvent):
        return event.model_copy(
            update={"target": scrubber.text(event.target), "reason": scrubber.text(event.reason)}
        )
    return event


def _error_event(event: ErrorEvent, scrubber: Scrubber) -> ErrorEvent:
    return event.model_copy(
        update={"message": scrubber.text(event.message), "details": scrubber.value(event.details)}
    )


def scrub_error(body: dict[str, Any], scrubber: Scrubber) -> dict[str, Any]:
    """An error body with its message and details scrubbed (its provenance is the record's)."""
    out = dict(body)
    if isinstance(out.get("message"), str):
        out["message"] = scrubber.text(out["message"])
    if "details" in out:
        out["details"] = scrubber.value(out["details"])
    return out


def scrub_ending(ending: Ending, scrubber: Scrubber) -> Ending:
    """How a step ended, with what an upstream error quoted scrubbed from its ``error``
    event and from the step's ``error``: the same text in both, so the record agrees."""
    event = ending.event
    if ending.error is None and not isinstance(event, ErrorEvent):
        return ending
    return dataclasses.replace(
        ending,
        event=_error_event(event, scrubber) if isinstance(event, ErrorEvent) else event,
        error=None if ending.error is None else scrub_error(ending.error, scrubber),
    )
