from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "bad", ["pools: []", "pools:\n  - pool_id: a\n    engine: tpu\n    replicas: [{replica_id: r}]"]
)
def test_bad_pools_file_names_the_line(tmp_path: Path, bad: str) -> None:
    from orchestratord.pools.config import PoolConfigError, load_pools_file

    path = tmp_path / "pools.yaml"
    path.write_text(bad)
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    msg = str(info.value)
    assert str(path) in msg
    if "tpu" in bad:
        assert "pools.0.engine" in msg and "(line 3)" in msg
