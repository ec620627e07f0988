"""Settings as an operator writes them: list settings in the contract's three forms, and a bad
setting stopping ``serve`` with one line naming it (exit 2), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestratord.settings import BadSetting, load_settings
from tests.procs import orchestratord


@pytest.mark.parametrize(
    ("value", "hosts"),
    [
        ("127.0.0.1,localhost", ["127.0.0.1", "localhost"]),
        (" 10.1.0.0/16 , tools.internal ", ["10.1.0.0/16", "tools.internal"]),
        ('["10.1.0.0/16", "tools.internal"]', ["10.1.0.0/16", "tools.internal"]),
        ("", []),
        ("[]", []),
    ],
)
def test_allow_hosts_reads_comma_separated_json_and_empty(
    monkeypatch: pytest.MonkeyPatch, value: str, hosts: list[str]
) -> None:
    monkeypatch.setenv("ORCHESTRATORD_TOOLS__ALLOW_HOSTS", value)
    settings = load_settings()
    assert settings.tools.allow_hosts == hosts
    settings.tools.allow_list()  # each entry parsed


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("ORCHESTRATORD_TOOLS__ALLOW_HOSTS", '["10.0.0.0/8"', "not a JSON list"),
        ("ORCHESTRATORD_TOOLS__ALLOW_HOSTS", "10.0.0.0/33", "10.0.0.0/33"),
        ("ORCHESTRATORD_PORT", "eighty", "valid integer"),
        ("ORCHESTRATORD_STREAM__KEEPALIVE_S", "-1", "greater than 0"),
        ("ORCHESTRATORD_PROVISION__COMMANDS", "{not json", "ORCHESTRATORD_PROVISION"),
    ],
)
def test_a_bad_setting_is_named_with_what_it_accepts(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, said: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(BadSetting) as caught:
        load_settings()
    (line,) = caught.value.lines
    assert line.startswith(name.split("__")[0]), line
    assert said in line, line
    assert "\n" not in line


def test_a_bad_setting_never_echoes_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    # a value may be a secret (a pepper, a database password): the line names the setting only
    monkeypatch.setenv("ORCHESTRATORD_AUTH__CACHE_S", "hunter2-secret")
    with pytest.raises(BadSetting) as caught:
        load_settings()
    assert "hunter2" not in str(caught.value)
    assert "ORCHESTRATORD_AUTH__CACHE_S" in str(caught.value)


def _serve(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim", "--port", "0"],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_serve_stops_on_a_bad_setting_with_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _serve(tmp_path, {"ORCHESTRATORD_TOOLS__ALLOW_HOSTS": "10.0.0.0/33,localhost"})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("orchestratord: bad setting ORCHESTRATORD_TOOLS__ALLOW_HOSTS")
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("value", ["127.0.0.1,localhost", '["127.0.0.1", "localhost"]', ""])
def test_serve_starts_with_each_form_of_allow_hosts(tmp_path: Path, value: str) -> None:
    env = {"ORCHESTRATORD_TOOLS__ALLOW_HOSTS": value}
    with orchestratord(tmp_path, "--engine", "sim", env=env) as url:
        assert url.startswith("http://127.0.0.1:")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("ORCHESTRATORD_LOG_LEVEL", "loud", "one of debug, info"),
        ("ORCHESTRATORD_DATABASE_URL", "foo://x", "sqlite:///path or postgresql://"),
        ("ORCHESTRATORD_PRICE_TABLES_DIR", "/nonexistent", "not a directory"),
        ("ORCHESTRATORD_PRICE_TABLE", "1999-01-01", "no such price table"),
    ],
)
def test_serve_names_settings_checked_at_start(
    tmp_path: Path, name: str, value: str, said: str
) -> None:
    done = _serve(tmp_path, {name: value})
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"orchestratord: bad setting {name}"), line
    assert said in line, line
