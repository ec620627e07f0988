"""A client of the front door whose messages are compiled from the published Evergreen
schema (``tests/contracts/evergreen_upstream``), not from ours."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from google.protobuf import (  # type: ignore[import-untyped]
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    timestamp_pb2,
)

from contracts.protos import build, load

UPSTREAM = Path(__file__).resolve().parents[1] / "contracts" / "evergreen_upstream"
METHOD = "/evergreen.v2.EvergreenService/StartSession"
END_OF_TURN = "application/x-protobuf; type=EndOfTurn"


class Published:
    """The published schema's message classes, in a descriptor pool of their own."""

    def __init__(self) -> None:
        pool = descriptor_pool.DescriptorPool()
        for well_known in (any_pb2, timestamp_pb2):
            proto = descriptor_pb2.FileDescriptorProto()
            well_known.DESCRIPTOR.CopyToProto(proto)
            pool.AddSerializedFile(proto.SerializeToString())
        found = descriptor_pb2.FileDescriptorSet.FromString(
            build.descriptor_set(
                [UPSTREAM / "evergreen.proto", UPSTREAM / "evergreen_service.proto"]
            )
        )
        for proto in found.file:
            if not proto.name.startswith("google/"):
                pool.AddSerializedFile(proto.SerializeToString())

        def cls(name: str) -> Any:
            return message_factory.GetMessageClass(
                pool.FindMessageTypeByName(f"evergreen.v2.{name}")
            )

        self.SessionMessage = cls("SessionMessage")
        self.NodeFragment = cls("NodeFragment")
        self.Chunk = cls("Chunk")
        self.ChunkMetadata = cls("ChunkMetadata")
        self.Action = cls("Action")
        self.NamedParameter = cls("NamedParameter")


PUBLISHED = Published()


def text(
    node_id: str,
    data: str,
    *,
    seq: int = 0,
    continued: bool = False,
    role: str = "",
    metadata: bool | None = None,
) -> Any:
    """A text fragment; its metadata on seq 0 (``metadata``: on it or not, whatever its seq)."""
    p = PUBLISHED
    chunk = p.Chunk(data=data.encode())
    if metadata if metadata is not None else seq == 0:
        chunk.metadata.CopyFrom(p.ChunkMetadata(mimetype="text/plain", role=role))
    return p.NodeFragment(id=node_id, seq=seq, continued=continued, chunk_fragment=chunk)


def json_node(node_id: str, value: Any) -> Any:
    p = PUBLISHED
    chunk = p.Chunk(data=json.dumps(value).encode())
    chunk.metadata.CopyFrom(p.ChunkMetadata(mimetype="application/json"))
    return p.NodeFragment(id=node_id, chunk_fragment=chunk)


def end_of_turn(node_id: str) -> Any:
    p = PUBLISHED
    chunk = p.Chunk()
    chunk.metadata.CopyFrom(p.ChunkMetadata(mimetype=END_OF_TURN))
    return p.NodeFragment(id=node_id, chunk_fragment=chunk)


def parent(node_id: str, *children: str, seq: int = 0, continued: bool = False) -> Any:
    return PUBLISHED.NodeFragment(id=node_id, seq=seq, continued=continued, child_ids=children)


def generate_config(**fields: Any) -> Any:
    """Our GenerateConfig, packed in Any (the one message of ours a client sends)."""
    packed = any_pb2.Any()
    packed.Pack(load().evergreen_config.GenerateConfig(**fields))
    return packed


def action(
    name: str,
    inputs: dict[str, str],
    outputs: dict[str, str],
    *,
    configs: Iterable[Any] = (),
    target: str | None = None,
) -> Any:
    p = PUBLISHED
    a = p.Action(name=name)
    for config in configs:  # the published schema's own Any, in its own pool
        a.configs.add(type_url=config.type_url, value=config.value)
    for k, v in inputs.items():
        a.inputs.add(name=k, id=v)
    for k, v in outputs.items():
        a.outputs.add(name=k, id=v)
    if target is not None:
        a.target_spec.id = target
    return a


def message(*items: Any) -> Any:
    p = PUBLISHED
    msg = p.SessionMessage()
    for item in items:
        if isinstance(item, p.Action):
            msg.actions.append(item)
        else:
            msg.node_fragments.append(item)
    return msg


@dataclass
class Outcome:
    replies: list[Any] = field(default_factory=list)
    code: Any = None  # grpc.StatusCode
    details: str = ""
    initial: dict[str, str] = field(default_factory=dict)
    trailing: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.initial["x-run-id"]

    @property
    def error(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.trailing["x-error"])
        return body

    def fragments(self, node_id: str) -> list[Any]:
        return [f for r in self.replies for f in r.node_fragments if f.id == node_id]

    def text_of(self, node_id: str) -> str:
        return b"".join(f.chunk_fragment.data for f in self.fragments(node_id)).decode()


def metadata(
    flow_id: str, run: dict[str, Any] | None = None, key: str | None = None
) -> list[tuple[str, str]]:
    md = [("x-flow-id", flow_id), ("x-run", json.dumps(run or {"seed": 7}))]
    if key is not None:
        md.append(("authorization", f"Bearer {key}"))
    return md


async def start(
    port: int,
    md: list[tuple[str, str]],
    requests: AsyncIterator[Any],
    *,
    cancel_after: int | None = None,
) -> Outcome:
    """One session: ``requests`` sent (the client half-closes after them), every reply read;
    ``cancel_after``: the client cancels once that many replies came."""
    outcome = Outcome()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            METHOD,
            request_serializer=PUBLISHED.SessionMessage.SerializeToString,
            response_deserializer=PUBLISHED.SessionMessage.FromString,
        )(requests, metadata=md, timeout=60)
        try:
            async for reply in call:
                outcome.replies.append(reply)
                if cancel_after is not None and len(outcome.replies) >= cancel_after:
                    call.cancel()
                    break
        except grpc.aio.AioRpcError:
            pass
        outcome.code = await call.code()
        outcome.details = await call.details() or ""
        outcome.initial = {k: v for k, v in (await call.initial_metadata() or ())}
        outcome.trailing = {k: v for k, v in (await call.trailing_metadata() or ())}
    return outcome


async def sent(*messages: Any) -> AsyncIterator[Any]:
    for m in messages:
        yield m
