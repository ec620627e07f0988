"""A key is never in a URL: a request carrying a credential in its query is refused naming
the header to use, and no log line (the server's access log included) holds the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from orchestrator_core.secrets import scrub_url_credentials
from tests.procs import free_port, process

KEY = "ok_0123456789ab_" + "S" * 43


def test_a_key_anywhere_in_text_keeps_its_id_and_loses_its_secret() -> None:
    assert (
        scrub_url_credentials(f"GET /v1/runs?x={KEY} 200")
        == "GET /v1/runs?x=ok_0123456789ab_*** 200"
    )
    assert scrub_url_credentials(f"key {KEY}.") == "key ok_0123456789ab_***."
    assert scrub_url_credentials("ok_short_one stays") == "ok_short_one stays"


def test_a_credential_in_the_query_is_refused_and_never_logged(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'o.db'}"
    made = subprocess.run(
        [sys.executable, "-m", "orchestratord", "keys", "create", "--scope", "read"],
        capture_output=True,
        text=True,
        env={"ORCHESTRATORD_DATABASE_URL": db, "PATH": "/usr/bin:/bin"},
        check=True,
    )
    live = made.stdout.strip().split()[-1]
    assert live.startswith("ok_")
    port = free_port()
    args = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port)]
    args += ["--database-url", db, "--engine", "sim"]
    url = f"http://127.0.0.1:{port}"
    with process(args, ready_url=f"{url}/healthz", cwd=tmp_path):
        for query in (f"api_key={live}", f"token={KEY}", f"after=x&access_token={KEY}"):
            r = httpx.get(f"{url}/v1/runs?{query}")
            assert r.status_code == 422, r.text
            error = r.json()
            assert "Authorization header" in error["message"]
            field = error["details"]["errors"][0]["field"]
            assert field == "query." + query.split("=")[-2].split("&")[-1]
        r = httpx.get(f"{url}/healthz?api_key={live}")  # an open path too
        assert r.status_code == 422
        ok = httpx.get(f"{url}/v1/runs", headers={"authorization": f"Bearer {live}"})
        assert ok.status_code == 200
    logs = "".join(p.read_text() for p in tmp_path.glob("proc-*.log"))
    assert "GET /v1/runs?" in logs  # the access log wrote the requests...
    assert live.split("_")[-1] not in logs and "S" * 43 not in logs  # ...without the keys
