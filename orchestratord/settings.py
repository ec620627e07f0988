"""All settings, in one place. Nothing else reads the environment.

Every field can be set as ``ORCHESTRATORD_<NAME>`` (nested: ``ORCHESTRATORD_SIM__TOKENS_PER_S``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from orchestrator_core.breakers import BreakerConfig
from orchestrator_core.fs_roots import KERNEL_DIRS, root_refusal
from orchestrator_core.outbound import AllowList
from worker_adapters.registry import local_engines, runs_locally


def _listed(value: Any) -> Any:
    """A list setting as the environment writes it: comma-separated (``a,b``), a JSON list
    (``["a", "b"]``), or empty (none)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list ({exc.msg} at character {exc.pos})") from None
    return [part.strip() for part in text.split(",") if part.strip()]


# A list of strings from the environment in any of its three forms (pydantic-settings alone
# reads only JSON, and stops at anything else with a traceback).
EnvList = Annotated[list[str], NoDecode, BeforeValidator(_listed)]


def _local_engine(name: str) -> str:
    """A registered engine whose replica needs no url (``sim``, ``llama``)."""
    if not runs_locally(name):
        raise ValueError(f"not an engine that runs locally (those: {', '.join(local_engines())})")
    return name


class SimSettings(BaseModel):
    tokens_per_s: float = Field(
        default=50.0,
        ge=0,
        description="Token rate of the sim engine; 0 streams as fast as possible",
    )
    eos_probability: float = Field(default=0.02, ge=0, le=1, description="Chance of EOS per token")
    slots: int = Field(default=8, ge=1, description="Concurrent requests of the sim replica")


class StreamSettings(BaseModel):
    keepalive_s: float = Field(
        default=15.0,
        gt=0,
        description="Seconds without a frame before a stream sends `: keep-alive` (due on a"
        " 0.25 s grid shared by all streams: up to 0.25 s sooner)",
    )
    buffer_events: int = Field(
        default=4096, ge=16, description="Recent events each live stream keeps in memory"
    )
    read_batch: int = Field(default=512, ge=1, description="Events read from the log per query")
    catch_up_turns: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Streams of a process reading the log at once while they catch up (the"
        " others wait their turn, so requests are not starved); default: 1 on SQLite (its"
        " reads run on the event loop), 4 on PostgreSQL",
    )
    poll_s: float = Field(
        default=0.5,
        gt=0,
        description="How often a follower on PostgreSQL re-reads the log for other processes' "
        "writes (SQLite is one process: its followers are woken, never poll)",
    )
    max_followers_per_step: int = Field(
        default=256,
        ge=1,
        description="Open streams of one step in one process; more are refused with 429 "
        "LIMIT_EXCEEDED (retriable)",
    )
    max_followers: int = Field(
        default=20000,
        ge=1,
        description="Open streams (steps and runs) in one process; more are refused with 429 "
        "LIMIT_EXCEEDED (retriable)",
    )
    cancel_on_disconnect: bool = Field(
        default=False,
        description="Server-wide default: cancel a step when its last subscriber leaves",
    )


class DispatchSettings(BaseModel):
    poll_s: float = Field(
        default=0.5,
        gt=0,
        description="How often the dispatcher looks for queued steps and cancels (on SQLite, "
        "only where its last claim round left steps queued: every write there wakes it)",
    )
    max_pending_events: int = Field(
        default=20000, ge=100, description="Events waiting for commit before producers wait"
    )
    lease_s: float = Field(
        default=10.0,
        gt=0,
        description="A running step is leased to its process for this long, renewed every "
        "third of it; another process reaps it once the lease has expired",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        description="Executions a step gets when the process running it is lost before it "
        "streamed anything; then it fails with WORKER_LOST",
    )
    drain_s: float = Field(
        default=5.0,
        ge=0,
        description="On SIGTERM: how long running steps may take to finish before the process "
        "lets go of them (another process takes them over) and ends its streams",
    )


class AdmissionSettings(BaseModel):
    interactive_capacity: int = Field(
        default=1024, ge=0, description="Queued interactive steps the deployment holds"
    )
    batch_capacity: int = Field(default=4096, ge=0, description="Queued batch steps it holds")
    on_full: Literal["reject", "drop-lru"] = Field(
        default="reject",
        description="When a queue is full: refuse the new step, or drop the oldest queued one",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with a 429")


class ToolSettings(BaseModel):
    concurrency: int = Field(
        default=64, ge=1, description="Steps of control-plane kinds (tool calls) run at once"
    )
    default_timeout_ms: int = Field(
        default=10000, gt=0, description="HTTP tool timeout when the tool names none"
    )
    max_reply_bytes: int = Field(
        default=1_048_576, gt=0, description="Largest HTTP tool reply read; larger is TOOL_ERROR"
    )
    max_retries: int = Field(
        default=2, ge=0, description="Retries of a failed call, for tools marked idempotent only"
    )
    backoff_s: float = Field(default=0.1, ge=0, description="First retry delay; doubles")
    max_connections: int = Field(default=64, ge=1, description="HTTP connections kept to tools")
    allow_hosts: EnvList = Field(
        default_factory=list,
        description="Hosts (names) and networks (CIDRs) tools may reach beyond the public"
        " internet: loopback, private, link-local and metadata addresses are refused unless"
        " listed; comma-separated (10.1.0.0/16,tools.internal), a JSON list"
        ' (["10.1.0.0/16", "tools.internal"]) or empty (none)',
    )

    @field_validator("allow_hosts")
    @classmethod
    def _hosts_or_networks(cls, value: list[str]) -> list[str]:
        AllowList.parse(value)  # names the bad entry
        return value

    def allow_list(self) -> AllowList:
        return AllowList.parse(self.allow_hosts)


class BreakerSettings(BaseModel):
    """Circuit breakers per tool endpoint and per engine replica, in each process."""

    tool_failures: int = Field(
        default=5, ge=1, description="Consecutive failures of a tool endpoint that open it"
    )
    engine_failures: int = Field(
        default=5, ge=1, description="Consecutive failures of an engine replica that open it"
    )
    open_s: float = Field(
        default=30.0, gt=0, description="Seconds a breaker stays open before a trial call"
    )
    half_open_calls: int = Field(default=1, ge=1, description="Trial calls while half-open")

    def config(self, failures: int) -> BreakerConfig:
        return BreakerConfig(
            failure_threshold=failures, open_s=self.open_s, half_open_max_calls=self.half_open_calls
        )


class EngineLimitSettings(BaseModel):
    """What an engine may send and how long it may take, for the steps that call engines
    (llm_call, llm_plan), whatever its protocol. A step past a limit fails with
    ``ENGINE_ERROR`` whose details name the ``reason`` and the ``limit``."""

    max_token_bytes: int = Field(
        default=64 << 10,
        ge=1024,
        description="Bytes of one token (UTF-8); a larger one ends the step (token_too_large,"
        " not retriable), and an OpenAI-compatible stream line longer than such a token's JSON"
        " is not read further",
    )
    max_output_bytes: int = Field(
        default=8 << 20,
        ge=1024,
        description="Bytes of a step's output text (UTF-8); the token that would pass it ends"
        " the step (output_too_large, not retriable) and is not stored",
    )
    max_error_bytes: int = Field(
        default=64 << 10,
        ge=256,
        description="Bytes of an engine's error body read (the rest is left unread)",
    )
    idle_timeout_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds an engine may go without sending a token (keep-alives do not"
        " count); past it the step ends (engine_idle, retriable) and the engine is let go",
    )
    step_deadline_s: float = Field(
        default=1800.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds an engine step may run when no max_wall_ms (of the step or its"
        " run) bounds it; past it the step ends (step_deadline, not retriable: a budget's"
        " max_wall_ms asks for longer)",
    )
    busy_retries: int = Field(
        default=3,
        ge=0,
        description="Times a step asks again an engine that answered 429 or 503 with"
        " Retry-After before anything streamed, each after the wait it asked, while the wait"
        " ends before the step's deadline; else the step's error carries retry_after_ms",
    )


class ValidationSettings(BaseModel):
    """Client JSON Schemas and the values checked against them (tool args, fact data): what a
    schema may declare, how long a check may run, and how many errors an answer lists."""

    deadline_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds one check may run (a value against its schema; each schema a flow"
        " declares); past it the request is refused (413, limit validation.deadline_s)",
    )
    max_errors: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Errors a 422 lists; the others are counted (details.errors_not_listed)",
    )
    max_schema_nodes: int = Field(
        default=10_000,
        ge=100,
        description="Subschemas a schema may apply to one value with its $refs expanded"
        " (checked when a flow declares it)",
    )
    max_unique_items: int = Field(
        default=1_000,
        ge=1,
        description="The largest maxItems a uniqueItems array of objects or arrays may declare"
        " (one without maxItems is refused)",
    )
    inline_max_work: int = Field(
        default=2_000,
        ge=0,
        description="Checks cheaper than this run on the event loop, costlier ones on a worker"
        " thread outside the write transaction; a unit is one subschema applied to one part of"
        " the value, 0.5 to 5 microseconds (2,000: at most about 10 ms)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Worker threads for costly checks; more at once wait their turn",
    )


class CelSettings(BaseModel):
    """How gate expressions (CEL) are evaluated: in a few warm processes of their own, each
    with a memory cap and a deadline, over a bounded part of the run's facts. A gate past a
    limit fails with GATE_EXPR_INVALID whose details name the ``reason`` and the limit."""

    workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Processes evaluating gates, started at the first gate and kept warm; more"
        " gates at once wait their turn",
    )
    memory_mb: int = Field(
        default=512,
        ge=128,
        description="Address space of an evaluating process (RLIMIT_AS), in MiB; an evaluation"
        " past it ends (memory) and the process is replaced",
    )
    deadline_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds one evaluation may run; past it its process is killed and the"
        " step fails (deadline)",
    )
    max_input_bytes: int = Field(
        default=8 << 20,
        ge=1024,
        description="JSON bytes of the facts one evaluation sees: the latest facts that fit"
        " (and at most 9,999 of them)",
    )
    max_value_bytes: int = Field(
        default=128 << 20,
        ge=1 << 20,
        description="Bytes an evaluation may build (strings, lists), as estimated from the"
        " expression and the size of the facts it reads; past it the step fails (cost) without"
        " evaluating",
    )


class AuthSettings(BaseModel):
    """API keys (``orchestratord keys create``). Off unless keys exist or ``enabled``."""

    enabled: bool = Field(
        default=False,
        description="Require a key on every route (``serve --auth``); auth is also on as soon "
        "as any key exists",
    )
    open_metrics: bool = Field(
        default=True, description="/metrics answers without a key (scrapers rarely carry one)"
    )
    cache_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a verified key (and whether keys exist) is trusted without "
        "reading the database again; a revoked key stops working within this time",
    )
    pepper: str = Field(
        default="",
        description="A secret mixed into every stored key digest (HMAC-SHA-256): a copy of the"
        " database alone cannot check a guessed key. Every process needs the same; changing it"
        " invalidates the keys made under the old one",
    )
    max_failures_per_minute: int = Field(
        default=60,
        ge=0,
        description="Refused keys one client address, or naming one key id, may send per minute"
        " before it gets 429 (a key this process verified keeps working); 0: no limit",
    )
    limited_wait_s: float = Field(
        default=2.0,
        ge=0,
        le=60,
        allow_inf_nan=False,
        description="How long a request from an address past its refused keys waits before"
        " its 429 (at most the rest of the minute): a flood's connection sends one request per"
        " wait, not as many as the server can answer; 0: answered at once",
    )


class LimitSettings(BaseModel):
    """Request limits; each refusal is the error body, LIMIT_EXCEEDED naming the setting."""

    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest request body accepted (413)"
    )
    max_headers: int = Field(
        default=100, ge=1, description="Headers one request may carry (431 past it)"
    )
    max_header_bytes: int = Field(
        default=16384,
        ge=1024,
        description="Bytes of one request's header names and values together (431 past it)",
    )
    max_prompt_chars: int = Field(
        default=1_000_000, ge=1, description="Longest prompt (or messages, together) of a step"
    )
    max_tools_per_flow: int = Field(default=128, ge=0, description="Tools one flow may declare")
    max_tool_schema_bytes: int = Field(
        default=65536, ge=64, description="Largest parameters schema of one tool (canonical JSON)"
    )
    max_followers_per_key: int = Field(
        default=1000, ge=1, description="Open streams of one API key in one process"
    )
    requests_per_minute: int = Field(
        default=6000, ge=0, description="Requests per API key per minute, all processes; 0: none"
    )
    tokens_per_minute: int = Field(
        default=0,
        ge=0,
        description="Tokens (prompt estimate + max_tokens) submitted per API key per minute, "
        "all processes; 0: no limit",
    )


class TracingSettings(BaseModel):
    """OpenTelemetry spans, exported over OTLP/HTTP when an endpoint is set; off otherwise."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces; unset: "
        "no spans are made",
    )
    service_name: str = Field(default="orchestratord", description="service.name of the spans")


class EngineCommand(BaseModel):
    """A command that starts an engine server on this host (vLLM, SGLang, ...): each argument
    may name ``{port}``, ``{host}``, ``{model}``, ``{replica_id}`` and ``{python}`` (this
    interpreter)."""

    model_config = ConfigDict(extra="forbid")
    command: str = Field(
        min_length=1,
        description="e.g. `vllm serve {model} --host {host} --port {port}` (split as a shell"
        " would, then each argument filled in; no shell runs it)",
    )
    engine: str = Field(default="openai", description="the engine protocol it speaks")
    url: str = Field(default="http://{host}:{port}/v1", description="what a replica of it dials")
    health_path: str = Field(
        default="/v1/models", description="answers 200 once the engine takes requests"
    )
    model: str | None = Field(default=None, description="`{model}` when a request names none")


class ProvisionSettings(BaseModel):
    max_engines: int = Field(
        default=2,
        ge=0,
        description="Engines that provisioning may run at once, every process counted; 0: none",
    )
    idle_ttl_s: float = Field(
        default=900.0,
        ge=0,
        description="A provisioned pool no step used for this long is removed and its engines"
        " stopped; 0: never",
    )
    start_timeout_s: float = Field(
        default=180.0, gt=0, description="How long an engine may take to answer its health"
    )
    commands: dict[str, EngineCommand] = Field(
        default_factory=dict,
        description="Provisioners by name that start an engine server from a command"
        ' (JSON: {"vllm": {"command": "vllm serve {model} --port {port}"}})',
    )


def _fs_root(value: str) -> str:
    """An allowed root: absolute (a relative one is taken from the working directory), never
    in a place no run may reach."""
    path = os.path.abspath(value)
    refused = root_refusal(os.path.realpath(path), allowed=["/"], protected=KERNEL_DIRS)
    if refused is not None:
        raise ValueError(refused[1])
    return path


class FsSettings(BaseModel):
    allowed_roots: EnvList = Field(
        default_factory=list,
        description="Directories beneath which runs may name their fs_policy roots (resolved,"
        " links followed); /proc, /sys, /dev and the server's database and log files are never"
        " reachable, even beneath /; comma-separated (/srv/a,/srv/b), a JSON list or empty"
        " (no run may touch files); unset: <data_dir>/files, made at start",
    )

    @field_validator("allowed_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        return [_fs_root(v) for v in value]


class EvergreenSettings(BaseModel):
    port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the Evergreen gRPC front door (on `host`); unset: off",
    )
    input_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="How long an action waits for input nodes not received yet",
    )
    max_nodes: int = Field(default=10_000, ge=1, description="Nodes one session may hold")
    max_bytes: int = Field(
        default=64 << 20, ge=1, description="Bytes of chunk payloads one session may hold"
    )
    max_depth: int = Field(default=64, ge=1, description="Nesting depth of a node tree")
    max_id_bytes: int = Field(
        default=1024,
        ge=16,
        le=65536,
        description="Longest id one session takes (node, child and output ids; action, parameter"
        " and config names; target_spec.id; mimetype and role), in UTF-8 bytes",
    )
    max_pending_actions: int = Field(
        default=1000, ge=1, description="Actions one session has received and not run yet"
    )
    max_queued_outputs: int = Field(
        default=64,
        ge=1,
        description="Messages a session holds for a client that does not read them; past it the"
        " session's generation waits for the client",
    )
    idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description="A session that neither sends nor reads for this long while the server waits"
        " on it is ended (DEADLINE_EXCEEDED) and its run cancelled",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORCHESTRATORD_", env_nested_delimiter="__")

    database_url: str = Field(
        default=f"sqlite:///{Path.cwd() / 'orchestratord.db'}",
        description="SQLAlchemy URL: sqlite:///path or postgresql://user@host/db",
    )
    engine: Annotated[str, AfterValidator(_local_engine)] = Field(
        default="llama",
        description="Engine of the one local pool when no pools file is given: a registered"
        " engine that needs no url (sim, llama)",
    )
    pools_file: Path | None = Field(default=None, description="YAML file of pools")
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description="PostgreSQL connections kept open; half of them hold the write transactions "
        "of the hot paths, as many at once",
    )
    db_max_overflow: int = Field(
        default=10,
        ge=0,
        description="Extra PostgreSQL connections under load; keep (size + overflow) x processes "
        "below the server's max_connections",
    )
    host: str = "127.0.0.1"
    port: int = 8080
    instance: str | None = Field(
        default=None,
        description="This process's name in step leases, stable across restarts so a restart "
        "reaps at once what it held; default: <hostname>:<port>",
    )
    loop: Literal["auto", "asyncio", "uvloop"] = Field(
        default="auto", description="Event loop of the server: uvloop where installed (auto)"
    )
    http: Literal["auto", "h11", "httptools"] = Field(
        default="auto", description="HTTP/1.1 parser of the server: httptools where installed"
    )
    log_level: str = Field(
        default="info", description="One of debug, info, warning, error, critical"
    )
    log_format: Literal["text", "json"] = "text"
    health_interval_s: float = Field(
        default=5.0, gt=0, description="How often replicas are asked for health and capabilities"
    )
    llama_model_path: Path | None = Field(
        default=None, description="GGUF file of the local engine; default: the packaged Gemma 3"
    )
    sim: SimSettings = Field(default_factory=SimSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    breakers: BreakerSettings = Field(default_factory=BreakerSettings)
    engine_limits: EngineLimitSettings = Field(default_factory=EngineLimitSettings)
    cel: CelSettings = Field(default_factory=CelSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    price_tables_dir: Path | None = Field(
        default=None, description="Folder of price tables; default: the ones shipped"
    )
    price_table: str | None = Field(
        default=None, description="Price table version for new runs; default: the latest"
    )
    auth: AuthSettings = Field(default_factory=AuthSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    provision: ProvisionSettings = Field(default_factory=ProvisionSettings)
    evergreen: EvergreenSettings = Field(default_factory=EvergreenSettings)
    data_dir: Path = Field(
        default=Path.cwd() / "orchestratord-data",
        description="The server's own folder; fs.allowed_roots defaults to its files/",
    )
    fs: FsSettings = Field(default_factory=FsSettings)

    @model_validator(mode="after")
    def _default_fs_roots(self) -> Settings:
        self.data_dir = self.data_dir.absolute()
        if "allowed_roots" not in self.fs.model_fields_set:
            self.fs.allowed_roots = [str(self.data_dir / "files")]
        return self

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        return _log_level(value)

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        return _database_url(value)


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_DATABASES = ("sqlite", "postgresql", "postgres")


def _log_level(value: str) -> str:
    if value.lower() not in _LOG_LEVELS:
        raise ValueError(f"not a log level: one of {', '.join(_LOG_LEVELS)}")
    return value.lower()


def _database_url(value: str) -> str:
    scheme = value.split(":", 1)[0].split("+", 1)[0].lower() if ":" in value else ""
    if scheme not in _DATABASES:
        raise ValueError("not a database URL: sqlite:///path or postgresql://user@host/db")
    return value


class BadSetting(Exception):
    """Settings that cannot be used: one line per bad setting, naming its variable and what it
    accepts (never its value, which may be a secret)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def env_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable of a setting at ``loc`` (``("tools", "allow_hosts")``)."""
    names = [str(part) for part in loc if isinstance(part, str)]
    return "ORCHESTRATORD_" + "__".join(names).upper()


def _accepts(loc: tuple[int | str, ...]) -> str | None:
    """The description of the setting at ``loc``: what it accepts, in the settings' words."""
    model: Any = Settings
    description = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            break
        info = fields[part]
        description, model = info.description, info.annotation
    return description


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment and ``overrides``; ``BadSetting`` names what is wrong."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = tuple(error["loc"])
            line = f"{env_name(loc)}: {error['msg']}"
            accepts = _accepts(loc)
            if accepts:
                line += f" (accepts: {accepts})"
            lines.append(line)
        raise BadSetting(lines) from None
    except SettingsError as exc:
        # a value pydantic-settings could not decode before validation (JSON of a dict setting)
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        cause = exc.__cause__
        why = f": {cause}" if cause is not None else ""
        raise BadSetting([f"{env_name((field,))} (or a setting under it){why}"]) from None
