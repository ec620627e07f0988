"""Content addressing of flows: normalized AST + tool schemas + config -> SHA-256."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from orchestrator_core.canonical import canonical_json, normalize, sha256_of
from orchestrator_core.errors import InvalidParams, TooLarge
from orchestrator_core.schemas.rules import SchemaLimits, check_schema
from orchestrator_core.secrets import secret_param


@dataclass(frozen=True)
class FlowContent:
    ast: Any
    tools: list[dict[str, Any]]
    config: dict[str, Any]
    hash: str

    @property
    def flow_id(self) -> str:
        return flow_id_for(self.hash)


@dataclass(frozen=True)
class FlowLimits:
    """How much a flow may declare (settings ``limits.*``, ``validation.*``)."""

    max_tools: int = 128
    max_tool_schema_bytes: int = 65536
    max_schema_nodes: int = 10_000
    max_unique_items: int = 1_000

    @property
    def schemas(self) -> SchemaLimits:
        """What each of its JSON Schemas answers to (``schemas.rules``)."""
        return SchemaLimits(
            max_bytes=self.max_tool_schema_bytes,
            max_nodes=self.max_schema_nodes,
            max_unique_items=self.max_unique_items,
        )

    def check(self, tools: list[dict[str, Any]]) -> None:
        if len(tools) > self.max_tools:
            raise TooLarge(
                f"a flow declares at most {self.max_tools} tools, not {len(tools)}",
                limit="limits.max_tools_per_flow",
                value=self.max_tools,
                field="tools",
            )
        for i, tool in enumerate(tools):
            _no_credentials(tool, f"tools[{i}].executor.url")
            size = len(canonical_json(tool.get("parameters")))
            if size > self.max_tool_schema_bytes:
                raise TooLarge(
                    f"a tool's parameters schema is at most {self.max_tool_schema_bytes} bytes "
                    f"of canonical JSON, not {size}",
                    limit="limits.max_tool_schema_bytes",
                    value=self.max_tool_schema_bytes,
                    field=f"tools[{i}].parameters",
                )


def _no_credentials(tool: dict[str, Any], field: str) -> None:
    """A tool's URL is the flow's content, shown and exported as written: no user, password
    or credential-named query value in it."""
    executor = tool.get("executor") or {}
    url = executor.get("url") if isinstance(executor, dict) else None
    if not isinstance(url, str):
        return
    try:
        parts = urlsplit(url)
        has_user = parts.username is not None or parts.password is not None
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return  # the call fails naming the URL; nothing to leak
    named = [name for name, _ in query if secret_param(name)]
    if has_user or named:
        what = "a user or password" if has_user else f"a credential ({named[0]})"
        raise InvalidParams(
            f"a tool URL carries no credentials, and this one has {what}: the URL is the "
            "flow's content, shown and exported as written",
            field=field,
        )


def flow_id_for(content_hash: str) -> str:
    return "flow_" + content_hash.removeprefix("sha256:")


def normalize_flow(
    *,
    ast: Any,
    tools: list[dict[str, Any]],
    config: dict[str, Any],
    limits: FlowLimits | None = None,
) -> FlowContent:
    """Validate tool schemas, order tools by name, and hash the canonical content.

    Every JSON Schema (tools' ``parameters``, ``config.fact_schemas``) passes
    ``schemas.rules`` (with the default limits when none are given). Tool order is not
    material (tools are looked up by name), so ``[a, b]`` and ``[b, a]`` are the same flow.
    """
    if limits is not None:
        limits.check(tools)
    schema_limits = (limits or FlowLimits()).schemas
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = unicodedata.normalize("NFC", tool["name"])
        if name in seen:
            raise InvalidParams(f"tool name {name!r} is used twice", field=f"tools[{i}].name")
        seen.add(name)
        check_schema(tool["parameters"], field=f"tools[{i}].parameters", limits=schema_limits)
    fact_schemas = config.get("fact_schemas", {})
    if not isinstance(fact_schemas, dict):
        raise InvalidParams("must map fact types to JSON Schemas", field="config.fact_schemas")
    for fact_type, schema in fact_schemas.items():
        check_schema(schema, field=f"config.fact_schemas.{fact_type}", limits=schema_limits)
    n_ast = normalize(ast, "ast")
    n_tools = sorted(
        (normalize(t, f"tools[{i}]") for i, t in enumerate(tools)), key=lambda t: t["name"]
    )
    n_config = normalize(config, "config")
    digest = sha256_of({"ast": n_ast, "tools": n_tools, "config": n_config})
    return FlowContent(ast=n_ast, tools=n_tools, config=n_config, hash=digest)
