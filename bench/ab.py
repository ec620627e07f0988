"""A/B of two checkouts on the rows of bench/latency.py, interleaved in one run.

The machine's speed drifts by tens of percent from minute to minute, so comparing two
separate runs of ``bench/latency.py`` mixes that drift into the result. Here every round
starts a server from checkout A, measures, then one from checkout B, and so on; each figure
is the median over rounds.

    .venv/bin/python bench/ab.py --a /path/to/before --b . [--rounds 3] [--pg]
        [--a-env ORCHESTRATORD_LOOP=asyncio ...] [--b-env ...] [--idle-streams 10000]
        [--one-request]

``--one-request``: the client submits each step and follows it in one request (``Accept:
text/event-stream``), as the interpreter does; by default in two (submit, then ``GET`` the
stream), which trees from before the one-request answer also serve.

``--idle-streams N`` adds the idle row to every round (``bench/idle_followers.py``: N idle
run streams held ``--idle-seconds``, the server's CPU share of a core and its RSS), on the
same interleaving; at 10,000 streams a round takes about a minute more per side.

Writes ``bench/results/ab.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import idle_followers, latency  # noqa: E402


def flat(rows: dict[str, Any]) -> dict[str, float]:
    return {
        "idle_ttft_p50_ms": rows["ttft_idle"]["p50_ms"],
        "loaded_ttft_p99_ms": rows["ttft_loaded"]["ttft_p99_ms"],
        "tokens_per_cpu_s": rows["relay"]["tokens_per_cpu_s"],
        **rows["steps"],
    }


async def measure_on(
    label: str, tree: Path, extra: dict[str, str], env: dict[str, str], tmp: Path, a: Any
) -> dict[str, float]:
    pools = ["--pools", str(tmp / "pools.yaml")]

    async def one(url: str) -> dict[str, float]:
        if a.one_request:  # every row with the client that submits and follows in one request
            return flat(await one_request_rows(url))
        # the two-request client: a tree from before the one-request answer has no other
        rows = await latency.orchestratord(
            str(tree), url, pools, {**env, **extra}, tmp, a, tree, one_request=False
        )
        return flat(rows)

    async def one_request_rows(url: str) -> dict[str, Any]:
        server = await latency.start_orchestratord(
            str(tree), url, pools, {**env, **extra}, tmp, tree
        )
        try:
            runs = await latency.make_runs(server.base_url, max(a.streams, a.step_clients))
            stream = latency.orchestrated_stream(server.base_url, runs, one_request=True)
            return await latency.run_rows(latency.Target(str(tree), stream, server), a)
        finally:
            await server.stop()

    async def idle(url: str) -> dict[str, float]:
        row = await idle_followers.measure(url, a.idle_streams, a.idle_seconds, str(tmp), tree)
        return {
            "idle_cpu_share": row["server_cpu_share_of_a_core"],
            "idle_rss_mib": row["rss_mib_total"],
        }

    if a.idle_streams:
        return {
            **await latency.on_database(label, a, one, tmp),
            **await latency.on_database(label, a, idle, tmp),
        }

    return await latency.on_database(label, a, one, tmp)


def parse_env(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    fake, upstream = await latency.start_engine(tmp)
    env = latency.write_pools(tmp, upstream, max(64, a.streams))
    sides = {"A": (Path(a.a), parse_env(a.a_env)), "B": (Path(a.b), parse_env(a.b_env))}
    out: dict[str, Any] = {"args": vars(a), "rounds": []}
    try:
        for r in range(a.rounds):
            for name, (tree, extra) in sides.items():
                for label in ("SQLite", "PostgreSQL") if a.pg else ("SQLite",):
                    try:
                        row = await asyncio.wait_for(
                            measure_on(label, tree, extra, env, tmp, a), a.timeout_s
                        )
                    except TimeoutError:  # a stuck round is reported, not waited for
                        print(f"round {r} {name} {label}: timed out", flush=True)
                        continue
                    out["rounds"].append({"round": r, "side": name, "db": label, **row})
                    print(f"round {r} {name} {label}: {row}", flush=True)
    finally:
        await fake.stop()
    summary: dict[str, Any] = {}
    for label in ("SQLite", "PostgreSQL") if a.pg else ("SQLite",):
        for name in sides:
            rows = [x for x in out["rounds"] if x["side"] == name and x["db"] == label]
            if not rows:
                continue
            keys = [k for k in rows[0] if k not in ("round", "side", "db")]
            summary[f"{name} {label}"] = {k: statistics.median(x[k] for x in rows) for k in keys}
    out["median"] = summary
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="checkout A (before)")
    ap.add_argument("--b", default=str(ROOT), help="checkout B (after)")
    ap.add_argument("--a-env", nargs="*", default=[])
    ap.add_argument("--b-env", nargs="*", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--one-request",
        action="store_true",
        help="submit and follow each step in one request (both trees must answer so)",
    )
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per server and round")
    ap.add_argument("--idle-streams", type=int, default=0, help="0: no idle row")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    latency.add_workload_args(ap, idle_probes=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ab.json"))
    a = ap.parse_args()
    a.repeat = 1  # one measurement per side and round; the rounds give the median
    if a.idle_streams:  # the client holds a socket per stream
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * a.idle_streams + 1024), hard))
    out = asyncio.run(main_async(a))
    Path(a.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    for name, row in out["median"].items():
        print(name, {k: round(v, 2) for k, v in row.items()})


if __name__ == "__main__":
    main()
