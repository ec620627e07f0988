"""Engines are registered variants: a new one is a module and a line in ``ENGINES``; the pools
file, the settings and the CLI look engines up there, and each engine's typed options are
checked with errors that name ``replicas.N.options.FIELD``."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from orchestratord.cli import build_parser
from orchestratord.pools.config import PoolConfigError, PoolSpec, ReplicaSpec, load_pools_file
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, started_client, submit
from worker_adapters.registry import ENGINES, variant

ECHO_POOL = """\
pools:
  - pool_id: talk
    engine: echo
    price: {free: true}
    replicas:
      - replica_id: r1
        options: {repeat: 2}
"""


@pytest.fixture
def echo_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # the one registration line, as an engine module's author would add it to ENGINES
    monkeypatch.setitem(ENGINES, "echo", "tests.pools.echo_engine")


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, pools_yaml: str) -> AsyncIterator[httpx.AsyncClient]:
    path = tmp_path / "pools.yaml"
    path.write_text(pools_yaml)
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", pools_file=path)
    orch = Orchestrator(settings)
    async with started_client(orch, "http://t") as client:
        yield client


async def test_a_new_engine_is_one_module_and_one_registration_line(
    echo_registered: None, tmp_path: Path
) -> None:
    async with serving(tmp_path, ECHO_POOL) as client:
        pools = (await client.get("/v1/pools")).json()
        assert [(p["pool_id"], p["engine"], p["health"]) for p in pools] == [
            ("talk", "echo", "ready")
        ]
        run_id = await make_run(client)
        r = await submit(client, run_id, prompt="plan the river", max_tokens=5)
        assert r.status_code in (200, 201, 202), r.text
        step_id = r.json()["step_id"]
        events = await read_stream(client, f"/v1/steps/{step_id}/stream")
        step = (await client.get(f"/v1/steps/{step_id}")).json()
    assert step["status"] == "succeeded", step.get("error")
    assert step["pool_id"] == "talk"
    # its typed options reached its factory: each word twice, cut at max_tokens
    assert step["output"]["text"] == "plan plan the the river "
    assert step["output"]["stop_reason"] == "length"
    assert [e.data["t"] for e in events if e.event == "token" and e.data] == [
        "plan ",
        "plan ",
        "the ",
        "the ",
        "river ",
    ]
    started = next(e.data for e in events if e.event == "started" and e.data)
    assert started["engine"] == "echo" and started["model"] == "echo-1"


def test_the_new_engine_s_options_are_checked(echo_registered: None, tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(ECHO_POOL.replace("{repeat: 2}", "{repeat: 9, loud: true}"))
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    lines = str(info.value).splitlines()
    at = f"{path}: pools.0.replicas.0.options"
    assert lines == [
        f"{at}.repeat (line 7): Input should be less than or equal to 8",
        f"{at}.loud (line 7): echo has no such option (its options: repeat)",
    ]


def test_settings_and_the_cli_offer_a_registered_engine_that_needs_no_url(
    echo_registered: None, tmp_path: Path
) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", engine="echo")
    assert settings.engine == "echo"
    args = build_parser().parse_args(["serve", "--engine", "echo"])
    assert args.engine == "echo"
    # an engine that needs a url cannot be the one local pool
    with pytest.raises(ValidationError, match="not an engine that runs locally"):
        make_settings(f"sqlite:///{tmp_path / 'o.db'}", engine="kakeya")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--engine", "kakeya"])


def test_an_unregistered_engine_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(ECHO_POOL)
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: pools.0.engine (line 3): Value error, unknown engine")
    assert "'echo' (known: evergreen, kakeya, llama, openai, salience, sim, uma)" in message


POOL = """\
pools:
  - pool_id: p
    engine: {engine}
    replicas:
      - replica_id: r0
        url: {url}
      - replica_id: r1
        url: {url}
        options:
          {option}
"""

URLS = {
    "sim": "null",
    "llama": "null",
    "openai": "http://127.0.0.1:8000/v1",
    "kakeya": "grpc://127.0.0.1:50051",
    "salience": "127.0.0.1:50052",
    "uma": "unix:///run/uma.sock",
}


@pytest.mark.parametrize(
    ("engine", "option", "says"),
    [
        ("sim", "eos_probability: 2", "Input should be less than or equal to 1"),
        ("sim", "tokens_per_s: -1", "Input should be greater than or equal to 0"),
        ("llama", "n_ctx: big", "Input should be a valid integer"),
        ("openai", "read_timeout_s: soon", "Input should be a valid number"),
        ("kakeya", "context_size: [1]", "Input should be a valid integer"),
        ("kakeya", "tokenizer: 5", "Input should be a valid string"),
        ("salience", "top_logprobs: -1", "Input should be greater than or equal to 0"),
        ("uma", "context_size: lots", "Input should be a valid integer"),
    ],
)
def test_a_bad_option_is_refused_naming_its_field_and_line(
    tmp_path: Path, engine: str, option: str, says: str
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOL.format(engine=engine, url=URLS[engine], option=option))
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    field = option.partition(":")[0]
    message = str(info.value)
    assert message.startswith(f"{path}: pools.0.replicas.1.options.{field} (line 10): "), message
    assert says in message and "\n" not in message


@pytest.mark.parametrize("engine", sorted(URLS))
def test_an_unknown_option_is_refused_naming_it_and_the_engine_s_options(
    tmp_path: Path, engine: str
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOL.format(engine=engine, url=URLS[engine], option="colour: blue"))
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    known = ", ".join(variant(engine).options.model_fields)
    assert str(info.value) == (
        f"{path}: pools.0.replicas.1.options.colour (line 10): "
        f"{engine} has no such option (its options: {known})"
    )


def test_a_pool_built_in_code_names_the_option_too() -> None:
    replica = ReplicaSpec(replica_id="r0", url="grpc://h:1", options={"top_logprobs": "x"})
    with pytest.raises(ValidationError) as info:
        PoolSpec(pool_id="p", engine="salience", replicas=[replica])
    (error,) = info.value.errors()
    assert error["loc"] == ("replicas", 0, "options", "top_logprobs")
    assert error["type"] == "int_parsing"


def test_the_forms_already_served_are_still_accepted(tmp_path: Path) -> None:
    """The README's and the contract's examples, and values written as strings (read as
    before: ``n_ctx: "4096"`` is 4096)."""
    path = tmp_path / "pools.yaml"
    path.write_text(
        """\
pools:
  - pool_id: eu
    engine: openai
    replicas:
      - replica_id: r1
        url: http://127.0.0.1:8001/v1
        slots: 4
        options: {api_key: "k", read_timeout_s: 60, model_hash: "sha256:00"}
  - pool_id: local
    engine: llama
    replicas: [{replica_id: r0, slots: 1, options: {n_ctx: "4096", n_threads: 2}}]
  - pool_id: k
    engine: kakeya
    replicas: [{replica_id: r0, url: "127.0.0.1:50051", options: {tokenizer: sim}}]
  - pool_id: s
    engine: salience
    replicas:
      - {replica_id: r0, url: "grpc://127.0.0.1:50052", options: {tokenizer: packaged}}
      - {replica_id: r1, url: "dns:///127.0.0.1:50052", options: {tokenizer: /m.gguf}}
  - pool_id: u
    engine: uma
    replicas: [{replica_id: r0, url: "unix:/run/uma.sock"}]
  - pool_id: sim
    engine: sim
    replicas: [{replica_id: r0, slots: 8, options: {tokens_per_s: 0, eos_probability: 0}}]
"""
    )
    specs = load_pools_file(path)
    assert [s.engine for s in specs] == ["openai", "llama", "kakeya", "salience", "uma", "sim"]
    llama = variant("llama").parse_options(specs[1].replicas[0].options)
    assert llama.model_dump() == {
        "model_path": None,
        "n_ctx": 4096,
        "n_threads": 2,
        "n_threads_batch": None,
    }


@pytest.mark.parametrize(
    ("engine", "url", "says"),
    [
        ("kakeya", "grpc://127.0.0.1", "'grpc://127.0.0.1' is not grpc://host:port"),
        ("salience", "grpc://:50052", "'grpc://:50052' is not grpc://host:port"),
        ("salience", "null", "a salience replica needs its gRPC address as url, e.g. grpc://"),
    ],
)
def test_a_grpc_url_of_no_accepted_form_is_refused(
    tmp_path: Path, engine: str, url: str, says: str
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOL.format(engine=engine, url=url, option="{}"))
    with pytest.raises(PoolConfigError, match=r"pools\.0\.replicas\.0\.url \(line 6\): ") as info:
        load_pools_file(path)
    assert says in str(info.value)


def test_a_replica_of_the_one_slot_engine_with_more_slots_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n  - pool_id: p\n    engine: llama\n    replicas: [{replica_id: r0, slots: 2}]\n"
    )
    with pytest.raises(
        PoolConfigError,
        match=r"a llama replica has exactly one slot \(its state is reset per request\)",
    ):
        load_pools_file(path)


def test_the_service_imports_no_engine_module() -> None:
    """orchestratord looks engines up in the registry: it imports none of their modules (nor
    their session and tokenizer helpers), so it cannot branch on which engine it holds."""
    root = Path(__file__).resolve().parents[2] / "orchestratord"
    engine_modules = {
        *ENGINES.values(),
        "worker_adapters.grpc_sessions",
        "worker_adapters.sessions",
        "worker_adapters.tokenizers",
    }
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [f"{path.relative_to(root)}: {n}" for n in names if n in engine_modules]
    assert found == []
