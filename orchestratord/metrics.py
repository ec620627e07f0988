"""Prometheus metrics of one process, served on ``GET /metrics`` (names in docs/metrics.md).

Counters and histograms are fed where things happen (a step ends, a token arrives, the event
writer commits); gauges that describe state (queue depth, SSE subscribers, breaker states,
replica health) are read when scraped. Each process has its own registry: with several
processes on PostgreSQL, scrape every one and sum counters; the queue depth, read from the
shared database, is the same on each (take the max).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DECODE = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class State:
    """A snapshot of what the gauges show, taken at scrape time."""

    def __init__(
        self,
        *,
        queued: dict[tuple[str, str], int],
        subscribers: dict[str, int],
        breakers: dict[str, dict[str, str]],
        replicas: Iterable[tuple[str, str, bool, bool, int, int]],
        reaped: dict[str, int] | None = None,
    ) -> None:
        self.queued = queued  # (pool or "control", priority) -> queued steps
        self.subscribers = subscribers  # "step" | "run" -> open streams
        self.breakers = breakers  # "engine" | "tool" -> target -> state
        self.replicas = list(replicas)  # (pool, replica, live, ready, busy, slots)
        self.reaped = reaped or {}  # outcome -> running steps taken back from lost processes


class _StateCollector(Collector):
    def __init__(self) -> None:
        self.state: State | None = None

    def collect(self) -> Iterator[Metric]:
        state = self.state
        if state is None:
            return
        queued = GaugeMetricFamily(
            "orchestratord_queue_depth",
            "Queued steps by pool (control: steps that run in the control plane) and priority",
            labels=["pool", "priority"],
        )
        for (pool, priority), n in sorted(state.queued.items()):
            queued.add_metric([pool, priority], n)
        yield queued
        subs = GaugeMetricFamily(
            "orchestratord_sse_subscribers",
            "Open event streams of this process, by what they follow",
            labels=["stream"],
        )
        for stream, n in sorted(state.subscribers.items()):
            subs.add_metric([stream], n)
        yield subs
        breakers = GaugeMetricFamily(
            "orchestratord_breaker_state",
            "1 for each known circuit breaker's current state",
            labels=["kind", "target", "state"],
        )
        for kind, targets in sorted(state.breakers.items()):
            for target, breaker_state in targets.items():
                breakers.add_metric([kind, target, breaker_state], 1)
        yield breakers
        live = GaugeMetricFamily(
            "orchestratord_replica_ready", "1 when the replica is ready", labels=["pool", "replica"]
        )
        busy = GaugeMetricFamily(
            "orchestratord_replica_busy_slots", "Requests in flight", labels=["pool", "replica"]
        )
        slots = GaugeMetricFamily(
            "orchestratord_replica_slots", "Concurrent requests allowed", labels=["pool", "replica"]
        )
        for pool, replica, _live, ready, in_flight, allowed in state.replicas:
            live.add_metric([pool, replica], 1 if ready else 0)
            busy.add_metric([pool, replica], in_flight)
            slots.add_metric([pool, replica], allowed)
        yield from (live, busy, slots)
        reaped = CounterMetricFamily(
            "orchestratord_steps_reaped",
            "Running steps this process took back from a lost process, by outcome",
            labels=["outcome"],
        )
        for outcome, n in sorted(state.reaped.items()):
            reaped.add_metric([outcome], n)
        yield reaped


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.steps = Counter(
            "orchestratord_steps",
            "Steps this process executed to their end, by kind and status",
            ["kind", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "orchestratord_time_to_first_token_seconds",
            "Engine steps: start of the step to its first token",
            ["pool"],
            buckets=_LATENCY,
            registry=r,
        )
        self.decode = Histogram(
            "orchestratord_decode_seconds",
            "Engine steps: time spent generating, start to end",
            ["pool"],
            buckets=_DECODE,
            registry=r,
        )
        self.tokens = Counter(
            "orchestratord_tokens",
            "Tokens of engine steps, in (prompt) and out (generated)",
            ["pool", "direction"],
            registry=r,
        )
        self.refusals = Counter(
            "orchestratord_refusals",
            "Requests refused before anything ran, by error code (BUDGET_EXCEEDED, "
            "POLICY_DENIED, ADMISSION_REJECT...)",
            ["code"],
            registry=r,
        )
        self.policy = Counter(
            "orchestratord_policy_decisions",
            "Policy decisions on submitted steps",
            ["decision"],
            registry=r,
        )
        self.placements = Counter(
            "orchestratord_placements",
            "Engine steps placed on a replica",
            ["pool", "replica"],
            registry=r,
        )
        self.placement_decisions = Counter(
            "orchestratord_placement_decisions",
            "Placements of submitted engine steps by rule (auto, pin, affinity, replay) and"
            " outcome (placed; refused: no pool matches or serves it; unavailable: none ready)",
            ["rule", "outcome"],
            registry=r,
        )
        self.placement_passed_over = Counter(
            "orchestratord_placement_passed_over",
            "Candidate replicas a placement left out, by cause (placement, model, feature,"
            " unready, draining, breaker_open)",
            ["cause"],
            registry=r,
        )
        self.writer_batch = Histogram(
            "orchestratord_event_writer_batch_events",
            "Events per event-log commit",
            buckets=_BATCH,
            registry=r,
        )
        self.writer_commit = Histogram(
            "orchestratord_event_writer_commit_seconds",
            "Duration of an event-log commit",
            buckets=_LATENCY,
            registry=r,
        )
        self._state = _StateCollector()
        self.registry.register(self._state)

    def commit(self, events: int, seconds: float) -> None:
        self.writer_batch.observe(events)
        self.writer_commit.observe(seconds)

    def render(self, state: State) -> bytes:
        self._state.state = state
        try:
            return generate_latest(self.registry)
        finally:
            self._state.state = None
