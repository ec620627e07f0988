from contracts.openapi import PATH, render


def test_committed_openapi_is_current() -> None:
    assert PATH.read_text() == render(), "run: python -m contracts.openapi"


def test_contract_paths_are_documented() -> None:
    import json

    paths = set(json.loads(PATH.read_text())["paths"])
    for path in (
        "/v1/flows",
        "/v1/flows/{flow_id}",
        "/v1/flows:by-hash/{content_hash}",
        "/v1/flows/{flow_id}/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/steps",
        "/v1/steps/{step_id}",
        "/v1/steps/{step_id}/stream",
        "/v1/steps/{step_id}/cancel",
        "/v1/runs/{run_id}/facts",
        "/v1/runs/{run_id}/checkpoint",
        "/v1/runs/{run_id}/checkpoints",
        "/v1/runs/{run_id}/stream",
        "/v1/pools",
        "/v1/pools/{pool_id}",
    ):
        assert path in paths, path
