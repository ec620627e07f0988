"""The engine variants as registered: each declares typed options that describe every field and
refuse unknown ones, and the adapter modules import one another without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from worker_adapters.grpc_sessions import grpc_target
from worker_adapters.registry import (
    ENGINES,
    EngineDefaults,
    ReplicaConfig,
    local_engines,
    variant,
)
from worker_adapters.sim import SimAdapter

PACKAGE = Path(__file__).resolve().parents[2] / "worker_adapters"


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_each_engine_declares_options_that_describe_every_field(name: str) -> None:
    found = variant(name)
    assert found.name == name == found.adapter.kind
    assert found.options.model_config.get("extra") == "forbid"
    undescribed = [f for f, info in found.options.model_fields.items() if not info.description]
    assert undescribed == []
    found.options.model_validate({})  # every option has a default


def test_what_the_variants_declare() -> None:
    declared = {
        name: (v.session_bound, v.tokenizer, v.local, v.slots and v.slots[0])
        for name, v in ((n, variant(n)) for n in ENGINES)
    }
    assert declared == {
        "sim": (False, "engine", True, None),
        "llama": (False, "engine", True, 1),
        "openai": (False, "engine", False, None),
        "kakeya": (True, "control_plane", False, None),
        "salience": (True, "control_plane", False, None),
        "uma": (False, "engine", False, None),
        "evergreen": (True, "engine", False, None),
    }
    assert local_engines() == ["sim", "llama"]


def test_the_sim_factory_takes_the_settings_defaults_unless_options_say_otherwise() -> None:
    sim = variant("sim")
    replica = ReplicaConfig(replica_id="r0", url=None, address=None, model=None, slots=8)
    defaults = EngineDefaults(sim_tokens_per_s=0.0, sim_eos_probability=0.5)
    adapter = sim.adapter_for(replica, {}, defaults)
    assert isinstance(adapter, SimAdapter)
    assert (adapter.tokens_per_s, adapter.eos_probability, adapter.model) == (0.0, 0.5, "sim-1")
    adapter = sim.adapter_for(replica, {"eos_probability": 0.0, "tokens_per_s": 7}, defaults)
    assert isinstance(adapter, SimAdapter)
    assert (adapter.tokens_per_s, adapter.eos_probability) == (7.0, 0.0)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("grpc://127.0.0.1:50051", "127.0.0.1:50051"),
        ("GRPC://engine.internal:7/", "engine.internal:7"),
        ("grpc://[::1]:50051", "[::1]:50051"),
        ("127.0.0.1:50051", "127.0.0.1:50051"),  # the bare form, as gRPC reads it
        ("dns:///engine:50051", "dns:///engine:50051"),
        ("unix:/run/kakeya.sock", "unix:/run/kakeya.sock"),
    ],
)
def test_a_grpc_url_maps_to_its_target(url: str, target: str) -> None:
    assert grpc_target(url) == target


@pytest.mark.parametrize("url", ["grpc://", "grpc://host", "grpc://host:port", "grpc://a/b:1"])
def test_a_grpc_url_without_host_and_port_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="is not grpc://host:port"):
        grpc_target(url)


def _imports(path: Path) -> set[str]:
    """The ``worker_adapters`` modules ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("worker_adapters.")}
    return found


def test_the_adapter_modules_import_one_another_without_a_cycle() -> None:
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
    # the session handle and the tokenizers stand apart from what uses them
    assert graph["base"] == {"session_handle"}
    assert graph["session_handle"] == set()
