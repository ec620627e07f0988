"""Refused keys are limited per key id as well as per address: a client with many addresses
guessing one key id's secret is answered 429, through a real server."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from orchestratord.cli import main
from tests.hostile import poller, serve

pytestmark = pytest.mark.slow


def _minute_ahead(needed_s: float = 25.0) -> None:
    """Wait, if need be, for a minute of the server's counts with ``needed_s`` left in it: the
    refusals are counted per minute of the monotonic clock, which processes share here."""
    left = 60 - time.monotonic() % 60
    if left < needed_s:
        time.sleep(left + 0.1)


def _create_key(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["keys", "create", "--scope", "read", "--database-url", url]) == 0
    return capsys.readouterr().out.strip()


def test_thirty_loopback_addresses_guessing_one_key_id_are_limited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    key = _create_key(db, capsys)
    key_id = key[3:15]
    env = {"ORCHESTRATORD_AUTH__MAX_FAILURES_PER_MINUTE": "20"}
    env["ORCHESTRATORD_AUTH__LIMITED_WAIT_S"] = "0"
    with (
        serve(tmp_path, "--engine", "sim", "--database-url", db, env=env) as server,
        poller(server.url) as probes,
    ):
        guess = {"Authorization": f"Bearer ok_{key_id}_{'A' * 43}"}
        _minute_ahead()
        codes: list[int] = []
        for n in range(30):  # 30 addresses, 5 guesses each: none past its own limit
            transport = httpx.HTTPTransport(local_address=f"127.0.0.{n + 2}")
            with httpx.Client(transport=transport, base_url=server.url) as c:
                codes += [c.get("/v1/runs", headers=guess).status_code for _ in range(5)]
        assert codes[:20] == [401] * 20
        assert set(codes[20:]) == {429}, codes
        fresh = httpx.HTTPTransport(local_address="127.0.0.200")
        with httpx.Client(transport=fresh, base_url=server.url) as c:
            # the id is limited from a new address too; another id is not
            limited = c.get("/v1/runs", headers=guess)
            assert limited.status_code == 429
            assert limited.json()["details"]["limit"] == "auth.max_failures_per_minute"
            assert "key id" in limited.json()["message"]
            other = {"Authorization": f"Bearer ok_{'1' * 12}_{'A' * 43}"}
            assert c.get("/v1/runs", headers=other).status_code == 401
    probes.report.check("refused keys from 30 addresses")


def test_a_key_verified_before_keeps_working_while_its_id_is_guessed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    key = _create_key(db, capsys)
    env = {
        "ORCHESTRATORD_AUTH__MAX_FAILURES_PER_MINUTE": "5",
        "ORCHESTRATORD_AUTH__LIMITED_WAIT_S": "0",
    }
    with serve(tmp_path, "--engine", "sim", "--database-url", db, env=env) as server:
        good = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{server.url}/v1/runs", headers=good).status_code == 200
        guess = {"Authorization": f"Bearer {key[:16]}{'B' * 43}"}
        _minute_ahead()
        for n in range(10):
            transport = httpx.HTTPTransport(local_address=f"127.0.1.{n + 2}")
            with httpx.Client(transport=transport, base_url=server.url) as c:
                c.get("/v1/runs", headers=guess)
        assert httpx.get(f"{server.url}/v1/runs", headers=guess).status_code == 429
        assert httpx.get(f"{server.url}/v1/runs", headers=good).status_code == 200
