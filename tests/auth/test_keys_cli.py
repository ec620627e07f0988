"""``orchestratord keys`` and the public-bind guard, as an operator runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from orchestratord.cli import is_loopback, main
from tests.procs import orchestratord


def _keys(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = main(["keys", *args, "--database-url", url])
    out, err = capsys.readouterr()
    return code, out, err


def test_keys_create_list_revoke_against_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    code, out, err = _keys(capsys, url, "create", "--scope", "write", "--name", "ci bot")
    assert code == 0
    key = out.strip()
    assert key.startswith("ok_") and len(key) == 59
    assert "shown once" in err
    key_id, secret = key[3:15], key[16:]  # ok_<12 hex>_<secret>; the secret may hold "_"
    code, out, _ = _keys(capsys, url, "create", "--scope", "read")
    read_key = out.strip()
    code, listed, _ = _keys(capsys, url, "list")
    assert code == 0
    assert key_id in listed and "write" in listed and "ci bot" in listed and "active" in listed
    assert secret not in listed
    env = {"ORCHESTRATORD_AUTH__CACHE_S": "0"}
    with orchestratord(tmp_path, "--engine", "sim", "--database-url", url, env=env) as base:
        assert httpx.get(f"{base}/v1/pools").status_code == 401
        ok = httpx.post(
            f"{base}/v1/flows", json={"ast": {}}, headers={"Authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 201, ok.text
        low = httpx.post(
            f"{base}/v1/flows", json={"ast": {}}, headers={"Authorization": f"Bearer {read_key}"}
        )
        assert low.status_code == 403 and low.json()["code"] == "FORBIDDEN"
        code, out, _ = _keys(capsys, url, "revoke", key_id)
        assert code == 0 and key_id in out
        gone = httpx.get(f"{base}/v1/pools", headers={"Authorization": f"Bearer {key}"})
        assert gone.status_code == 401 and gone.json()["code"] == "UNAUTHENTICATED"
        log = "".join(p.read_text() for p in tmp_path.glob("proc-*.log"))
    assert secret not in log
    code, listed, _ = _keys(capsys, url, "list")
    assert "revoked" in listed
    code, _, err = _keys(capsys, url, "revoke", "0123456789ab")
    assert code == 1 and "no key 0123456789ab" in err


def test_bad_scope_is_refused(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestratord",
            "keys",
            "create",
            "--scope",
            "root",
            "--database-url",
            f"sqlite:///{tmp_path / 'k.db'}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "--scope" in r.stderr and "root" in r.stderr


def test_public_bind_with_auth_off_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestratord",
            "serve",
            "--host",
            "0.0.0.0",
            "--engine",
            "sim",
            "--database-url",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "refusing to serve on 0.0.0.0 with auth off" in r.stderr
    assert "--insecure" in r.stderr


def test_public_bind_serves_with_insecure_auth_or_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    public = ("--host", "0.0.0.0", "--engine", "sim", "--database-url", url)
    with orchestratord(tmp_path, *public, "--insecure") as base:
        assert httpx.get(f"{base}/v1/pools").status_code == 200
    with orchestratord(tmp_path, *public, "--auth") as base:
        assert httpx.get(f"{base}/v1/pools").status_code == 401
    assert _keys(capsys, url, "create", "--scope", "admin")[0] == 0
    with orchestratord(tmp_path, *public) as base:
        assert httpx.get(f"{base}/v1/pools").status_code == 401


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
