"""orchestratord's OpenAI adapter against a real engine: llama-cpp-python's own server
(``test_harness/llama_server.py``: the library's server, its model in the plain CPU layout)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.procs import ended_step, free_port, orchestratord, process

pytestmark = pytest.mark.slow


def test_text_through_orchestratord_equals_the_engine(tmp_path: Path, gguf: Path) -> None:
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "test_harness.llama_server",
        "--model",
        str(gguf),
        "--port",
        str(port),
        "--n_ctx",
        "1024",
    ]
    with process(cmd, ready_url=f"{engine}/v1/models", cwd=tmp_path, timeout_s=120):
        ask = {
            "prompt": "A short poem about rivers:",
            "max_tokens": 20,
            "temperature": 0,
            "seed": 17,
        }
        # The server keeps the last prompt's cache: a prompt read again is evaluated from it,
        # which can move a near tie of greedy decoding (the first answer here may differ from
        # every later one). Asked once before, the direct answer and the one through
        # orchestratord are both read from the cache.
        httpx.post(f"{engine}/v1/completions", json=ask, timeout=120).raise_for_status()
        direct = httpx.post(f"{engine}/v1/completions", json=ask, timeout=120).json()
        direct_text = direct["choices"][0]["text"]
        pools = tmp_path / "pools.yaml"
        pools.write_text(
            yaml.safe_dump(
                {
                    "pools": [
                        {
                            "pool_id": "llamacpp",
                            "engine": "openai",
                            "tags": {"kind": "cpu"},
                            "replicas": [
                                {
                                    "replica_id": "s1",
                                    "url": f"{engine}/v1",
                                    "model": "gemma",
                                    "slots": 1,
                                }
                            ],
                        }
                    ]
                }
            )
        )
        db = f"sqlite:///{tmp_path / 'o.db'}"
        with (
            orchestratord(tmp_path, "--database-url", db, "--pools", str(pools)) as base,
            httpx.Client(base_url=base, timeout=120) as c,
        ):
            pool = c.get("/v1/pools/llamacpp").json()
            assert pool["health"] == "ready"
            flow = c.post("/v1/flows", json={"ast": {"x": 1}}).json()
            run = c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 17}).json()
            step = c.post(
                f"/v1/runs/{run['run_id']}/steps",
                json={
                    "type": "llm_call",
                    "client_token": "a",
                    "input": {
                        "prompt": ask["prompt"],
                        "params": {"max_tokens": 20, "temperature": 0},
                    },
                },
            ).json()
            body = ended_step(c, step["step_id"])
        assert body["status"] == "succeeded", body
        assert direct_text
        assert body["output"]["text"] == direct_text
        assert body["provenance"]["pool_id"] == "llamacpp"
