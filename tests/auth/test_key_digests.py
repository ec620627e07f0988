"""Keys are stored as HMAC-SHA-256 digests under the server's pepper; a digest of the scheme
before (scrypt) still verifies and is rewritten on first use; an unknown key id costs the
same work as a known one; an address sending refused keys is answered 429 after its
allowance, while a key verified before keeps working."""

from __future__ import annotations

import secrets

import httpx
import pytest

from orchestrator_core import clock, keys
from orchestrator_core.keys import Scope
from orchestratord.auth import store
from orchestratord.db.models import ApiKey
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import started_client

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _orch(db_url: str, **auth: object) -> Orchestrator:
    return Orchestrator(make_settings(db_url, auth={"cache_s": 0, **auth}))


async def _row(orch: Orchestrator, key_id: str) -> ApiKey:
    async with orch.db.read() as session:
        row = await store.find(session, key_id=key_id)
    assert row is not None
    return row


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@SQLITE
async def test_a_new_key_is_an_hmac_digest_under_the_pepper(db_url: str) -> None:
    orch = _orch(db_url, pepper="p1")
    async with started_client(orch) as client:
        async with orch.db.write() as session:
            key = await store.create(session, scope=Scope.READ, name=None, pepper="p1")
        key_id, secret = keys.parse(key) or ("", "")
        row = await _row(orch, key_id)
        assert row.digest == keys.digest(secret, row.salt, "p1") and row.digest.startswith("h1$")
        assert (await client.get("/v1/runs", headers=_auth(key))).status_code == 200
        wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
        assert (await client.get("/v1/runs", headers=_auth(wrong))).status_code == 401
    # under another pepper the same stored digest does not verify
    async with started_client(_orch(db_url, pepper="p2")) as client:
        assert (await client.get("/v1/runs", headers=_auth(key))).status_code == 401


@SQLITE
async def test_a_key_stored_before_verifies_and_is_rewritten_on_first_use(db_url: str) -> None:
    orch = _orch(db_url)
    async with started_client(orch) as client:
        key_id, secret, salt = (
            secrets.token_hex(6),
            secrets.token_urlsafe(32),
            secrets.token_hex(16),
        )
        async with orch.db.write() as session:
            session.add(
                ApiKey(
                    key_id=key_id,
                    name="old",
                    scope="read",
                    salt=salt,
                    digest=keys.scrypt_digest(secret, salt),
                    created_at=clock.now(),
                )
            )
        key = f"ok_{key_id}_{secret}"
        assert not (await _row(orch, key_id)).digest.startswith("h1$")
        assert (await client.get("/v1/runs", headers=_auth(key))).status_code == 200
        assert (await _row(orch, key_id)).digest == keys.digest(secret, salt)  # rewritten
        assert (await client.get("/v1/runs", headers=_auth(key))).status_code == 200


def test_an_unknown_key_id_costs_the_work_of_a_known_one() -> None:
    # the verification of a known id is one HMAC; an unknown id computes one too
    secret = secrets.token_urlsafe(32)
    assert keys.verify_absent(secret) is False
    salt = secrets.token_hex(16)
    assert keys.verify(secret, salt, keys.digest(secret, salt))
    assert not keys.verify(secret + "x", salt, keys.digest(secret, salt))


@SQLITE
async def test_an_address_sending_refused_keys_waits_and_a_verified_key_does_not(
    db_url: str,
) -> None:
    orch = _orch(db_url, max_failures_per_minute=3)  # cache_s 0: every request is checked
    async with started_client(orch) as client:
        async with orch.db.write() as session:
            good = await store.create(session, scope=Scope.READ, name=None)
            fresh = await store.create(session, scope=Scope.READ, name=None)
        assert (await client.get("/v1/runs", headers=_auth(good))).status_code == 200
        bad = f"ok_{'0' * 12}_{'A' * 43}"
        codes = [(await client.get("/v1/runs", headers=_auth(bad))).status_code for _ in range(3)]
        assert codes == [401, 401, 401]
        waits: list[float] = []

        async def held(seconds: float) -> None:
            waits.append(seconds)

        orch.auth.wait = held  # type: ignore[assignment]
        r = await client.get("/v1/runs", headers=_auth(bad))
        assert r.status_code == 429, r.text
        assert r.json()["details"]["limit"] == "auth.max_failures_per_minute"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        # held before it was answered: a flood's connection sends one request per wait
        assert len(waits) == 1 and 0 < waits[0] <= orch.settings.auth.limited_wait_s
        # a key verified before keeps working from the address; one never verified waits
        assert (await client.get("/v1/runs", headers=_auth(good))).status_code == 200
        assert (await client.get("/v1/runs", headers=_auth(fresh))).status_code == 429
    # another address is not slowed
    orch2 = _orch(db_url, max_failures_per_minute=3)
    async with started_client(orch2) as client:
        transport = httpx.ASGITransport(app=client._transport.app, client=("10.9.9.9", 1))  # type: ignore[attr-defined]
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as other:
            for _ in range(3):
                await client.get("/v1/runs", headers=_auth(bad))
            assert (await other.get("/v1/runs", headers=_auth(fresh))).status_code == 200
