"""The provisioners: one class per way of starting engines; adding one is a class and a line
in ``provisioners()``.

A provisioner reads its own ``options`` (a pydantic model: errors name ``options.FIELD``),
starts the engines of a request and answers the pool that serves them (``PoolSpec``) with
the child processes it started (none for an engine that lives in this process).

- ``llama``: the llama engine in every process that serves the pool (no child process):
  the model is opened by each process, as a pools file's ``engine: llama`` pool is.
- ``llama_cpp_server``: one ``llama_cpp.server`` child process per replica on a free
  loopback port, served as an OpenAI-compatible pool (``engine: openai``).
- each command of the ``provision.commands`` setting: that command per replica (vLLM,
  SGLang, or any server speaking a registered engine protocol), healthy once its health
  path answers 200.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator_core.errors import InvalidParams
from orchestratord.pools.config import PoolSpec
from orchestratord.pools.provisioning.processes import EngineProcess, free_port, log_dir
from orchestratord.pools.provisioning.request import ProvisionRequest
from orchestratord.settings import EngineCommand, Settings
from worker_adapters.packaged_model import packaged_model_path

LOOPBACK = "127.0.0.1"


@dataclass
class Started:
    spec: PoolSpec
    processes: list[EngineProcess] = field(default_factory=list)


class Provisioner(Protocol):
    name: str
    description: str

    def plan(self, request: ProvisionRequest, settings: Settings) -> Started:
        """The pool it would serve and the processes it would start (not started yet);
        ``InvalidParams`` naming the field when the request does not fit."""
        ...


def _options(model: type[BaseModel], raw: dict[str, Any]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in ("options", *err["loc"]))
        raise InvalidParams(err["msg"], field=where) from None


def pool_spec(
    request: ProvisionRequest, *, engine: str, replicas: list[dict[str, Any]]
) -> PoolSpec:
    """The pool a request makes; a spec the engine refuses names the request's field."""
    try:
        return PoolSpec.model_validate(
            {
                "pool_id": request.pool_id,
                "engine": engine,
                "tags": request.tags,
                "gpu": None if request.gpu is None else request.gpu.model_dump(),
                "replicas": replicas,
            }
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        if loc[:1] == ["replicas"] and len(loc) > 2:  # a replica's field is the request's
            loc = loc[2:]
        where = ".".join(loc) or "provisioner"
        raise InvalidParams(err["msg"].removeprefix("Value error, "), field=where) from None


def _gguf(request: ProvisionRequest, settings: Settings) -> Path:
    """The model file a llama provisioner opens: the request's, the settings', or packaged."""
    if request.model is not None:
        path = Path(request.model)
    elif settings.llama_model_path is not None:
        path = settings.llama_model_path
    else:
        path = packaged_model_path()
    if not path.is_file():
        raise InvalidParams(f"no model file at {str(path)!r} on this host", field="model")
    return path


def _replica_ids(request: ProvisionRequest) -> list[str]:
    return [f"r{n}" for n in range(request.replicas)]


class LlamaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_ctx: int = Field(default=4096, ge=0, le=1 << 20, description="context size in tokens")


class InProcessLlama:
    name: str = "llama"
    description: str = "the llama engine inside each serving process"

    def plan(self, request: ProvisionRequest, settings: Settings) -> Started:
        options = _options(LlamaOptions, request.options)
        path = _gguf(request, settings)
        replicas = [
            {
                "replica_id": rid,
                "slots": request.slots,
                "model": path.stem,
                "options": {"model_path": str(path), "n_ctx": options.n_ctx},
            }
            for rid in _replica_ids(request)
        ]
        return Started(pool_spec(request, engine="llama", replicas=replicas))


class LlamaServerOptions(LlamaOptions):
    n_threads: int | None = Field(default=None, ge=1, le=1024, description="decode threads")


class LlamaCppServer:
    name: str = "llama_cpp_server"
    description: str = "a llama_cpp.server child process per replica"

    def plan(self, request: ProvisionRequest, settings: Settings) -> Started:
        options = _options(LlamaServerOptions, request.options)
        path = _gguf(request, settings)
        alias = path.stem

        def launch(rid: str, port: int) -> tuple[list[str], str, str]:
            argv = [sys.executable, "-m", "worker_adapters.llama_server", "--model", str(path)]
            argv += ["--model_alias", alias, "--host", LOOPBACK, "--port", str(port)]
            argv += ["--n_ctx", str(options.n_ctx)]
            if options.n_threads is not None:
                argv += ["--n_threads", str(options.n_threads)]
            url = f"http://{LOOPBACK}:{port}/v1"
            return argv, url, f"{url}/models"

        return _servers(request, engine="openai", model=alias, launch=launch)


class CommandServer:
    """A command from the settings, run once per replica."""

    description: str = "a command from the provision.commands setting"

    def __init__(self, name: str, command: EngineCommand) -> None:
        self.name = name
        self.command = command

    def plan(self, request: ProvisionRequest, settings: Settings) -> Started:
        if request.options:
            raise InvalidParams(f"the {self.name!r} provisioner takes no options", field="options")
        model = request.model or self.command.model
        command = self.command

        def launch(rid: str, port: int) -> tuple[list[str], str, str]:
            values = {
                "port": port,
                "host": LOOPBACK,
                "model": model or "",
                "replica_id": rid,
                "python": sys.executable,
            }
            argv = [arg.format_map(values) for arg in shlex.split(command.command)]
            health = f"http://{LOOPBACK}:{port}{command.health_path}"
            return argv, command.url.format_map(values), health

        return _servers(request, engine=command.engine, model=model, launch=launch)


def _servers(
    request: ProvisionRequest,
    *,
    engine: str,
    model: str | None,
    launch: Callable[[str, int], tuple[list[str], str, str]],
) -> Started:
    """One child process per replica on a free loopback port: ``launch(replica_id, port)``
    says its command, the url the replica dials and its health url."""
    processes, replicas = [], []
    for rid in _replica_ids(request):
        port = free_port(LOOPBACK)
        argv, url, health = launch(rid, port)
        processes.append(_process(request, rid, argv, port, url, health))
        replicas.append({"replica_id": rid, "url": url, "model": model, "slots": request.slots})
    return Started(pool_spec(request, engine=engine, replicas=replicas), processes)


def _process(
    request: ProvisionRequest, rid: str, argv: list[str], port: int, url: str, health: str
) -> EngineProcess:
    return EngineProcess(
        replica_id=rid,
        argv=argv,
        port=port,
        url=url,
        health_url=health,
        log_path=log_dir() / f"{request.pool_id}-{rid}-{port}.log",
    )


def provisioners(settings: Settings) -> dict[str, Provisioner]:
    """The provisioners by name: the built-in ones, and the settings' commands."""
    found: dict[str, Provisioner] = {p.name: p for p in (InProcessLlama(), LlamaCppServer())}
    for name, command in sorted(settings.provision.commands.items()):
        found.setdefault(name, CommandServer(name, command))
    return found
