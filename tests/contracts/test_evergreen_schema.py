"""Our Evergreen schema (``contracts/protos/evergreen*.proto``) against the published one, kept
unmodified under ``evergreen_upstream/``: the same files, imports, messages, fields (name,
number, type, label, oneof), reserved numbers, enums, services and methods. Then bytes: what
our generated classes write, classes compiled from the published schema read (and the other
way round), they equal an encoding written out by hand, and a client built on the published
schema holds a session with a server built on ours."""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf import (  # type: ignore[import-untyped]
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    struct_pb2,
    timestamp_pb2,
)

from contracts.protos import build

UPSTREAM = Path(__file__).resolve().parent / "evergreen_upstream"
UPSTREAM_COMMIT = "56d7b388944fa5c03655e26a2647ce4599064119"
# git blob ids of the two files at UPSTREAM_COMMIT: the reference must stay as published
UPSTREAM_BLOBS = {
    "evergreen.proto": "f15b9739531670307db7210ed020364c9909c565",
    "evergreen_service.proto": "54e97332e283a2dfdda54620edd540d907e255a7",
}
FILES = ("evergreen.proto", "evergreen_service.proto")  # dependencies first
METHOD = "/evergreen.v2.EvergreenService/StartSession"

FD = descriptor_pb2.FieldDescriptorProto


def compiled(folder: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    files = descriptor_pb2.FileDescriptorSet.FromString(
        build.descriptor_set([folder / name for name in FILES])
    ).file
    return {f.name: f for f in files}


def _options(message: Any) -> bytes:
    return bytes(message.options.SerializeToString(deterministic=True))


def shape(files: dict[str, descriptor_pb2.FileDescriptorProto]) -> dict[str, Any]:
    """Everything in the compiled schemas that bears on the wire (and on JSON), keyed by name
    so that a difference reads as a path to it; declaration order and comments are left out."""

    def enum(e: descriptor_pb2.EnumDescriptorProto) -> dict[str, Any]:
        return {
            "values": {v.name: v.number for v in e.value},
            "reserved": sorted((r.start, r.end) for r in e.reserved_range),
            "reserved_names": sorted(e.reserved_name),
            "options": _options(e),
        }

    def message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
        oneofs = [o.name for o in m.oneof_decl]
        return {
            "fields": {
                f.name: {
                    "number": f.number,
                    "type": FD.Type.Name(f.type),
                    "type_name": f.type_name,
                    "label": FD.Label.Name(f.label),
                    "oneof": oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
                    "proto3_optional": f.proto3_optional,
                    "json_name": f.json_name,
                    "default": f.default_value,
                    "options": _options(f),
                }
                for f in m.field
            },
            "oneofs": sorted(oneofs),
            "reserved": sorted((r.start, r.end) for r in m.reserved_range),
            "reserved_names": sorted(m.reserved_name),
            "extension_ranges": sorted((r.start, r.end) for r in m.extension_range),
            "messages": {n.name: message(n) for n in m.nested_type},
            "enums": {e.name: enum(e) for e in m.enum_type},
            "options": _options(m),
        }

    return {
        name: {
            "package": f.package,
            "syntax": f.syntax,
            "imports": sorted(f.dependency),
            "public_imports": sorted(f.dependency[i] for i in f.public_dependency),
            "options": _options(f),
            "extensions": sorted(x.name for x in f.extension),
            "messages": {m.name: message(m) for m in f.message_type},
            "enums": {e.name: enum(e) for e in f.enum_type},
            "services": {
                s.name: {
                    m.name: {
                        "input": m.input_type,
                        "output": m.output_type,
                        "client_streaming": m.client_streaming,
                        "server_streaming": m.server_streaming,
                        "options": _options(m),
                    }
                    for m in s.method
                }
                for s in f.service
            },
        }
        for name, f in files.items()
    }


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_reference_is_the_published_schema_unmodified() -> None:
    for name, blob in UPSTREAM_BLOBS.items():
        assert git_blob_id((UPSTREAM / name).read_bytes()) == blob, name
    readme = (UPSTREAM / "README.md").read_text()
    assert UPSTREAM_COMMIT in readme
    assert "Apache License" in (UPSTREAM / "LICENSE").read_text()
    for name in FILES:  # ours says which commit it matches
        assert UPSTREAM_COMMIT in (build.PROTO_DIR / name).read_text(), name


def test_our_schema_matches_the_published_one() -> None:
    ours, theirs = shape(compiled(build.PROTO_DIR)), shape(compiled(UPSTREAM))
    assert set(ours) == set(FILES)
    assert ours["evergreen_service.proto"]["services"]["EvergreenService"]["StartSession"][
        "client_streaming"
    ]
    assert ours == theirs


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("evergreen.proto", "int32 seq = 2;", "int32 seq = 12;"),  # a renumbered field
        ("evergreen.proto", "bytes data = 10;", "bytes data = 4;"),  # ... inside a oneof
        ("evergreen.proto", "int32 seq = 2;", "int64 seq = 2;"),  # another type
        ("evergreen.proto", "string id = 2;", "string node_id = 2;"),  # a renamed field
        ("evergreen.proto", "optional Chunk chunk_fragment", "Chunk chunk_fragment"),
        ("evergreen.proto", "reserved 1;", ""),
        ("evergreen_service.proto", "returns (stream SessionMessage)", "returns (SessionMessage)"),
    ],
)
def test_the_comparison_catches_a_changed_schema(
    tmp_path: Path, name: str, old: str, new: str
) -> None:
    for each in FILES:
        (tmp_path / each).write_bytes((build.PROTO_DIR / each).read_bytes())
    text = (tmp_path / name).read_text()
    assert text.count(old) == 1
    (tmp_path / name).write_text(text.replace(old, new))
    assert shape(compiled(tmp_path)) != shape(compiled(UPSTREAM))


# --- bytes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ours() -> dict[str, ModuleType]:
    build.ensure_built()
    importlib.invalidate_caches()
    names = ("evergreen_pb2", "evergreen_service_pb2", "evergreen_service_pb2_grpc")
    return {n: importlib.import_module(f"contracts.protos.gen.{n}") for n in names}


@pytest.fixture(scope="module")
def upstream_session_message() -> Any:
    """``SessionMessage`` compiled from the published schema, in a pool of its own (ours holds
    the same names in the default pool)."""
    pool = descriptor_pool.DescriptorPool()
    for well_known in (any_pb2, timestamp_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        well_known.DESCRIPTOR.CopyToProto(proto)
        pool.AddSerializedFile(proto.SerializeToString())
    files = compiled(UPSTREAM)
    for name in FILES:
        pool.AddSerializedFile(files[name].SerializeToString())
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("evergreen.v2.SessionMessage")
    )


def packed(message: Any) -> Any:
    wrapped = any_pb2.Any()
    wrapped.Pack(message)
    return wrapped


def a_session_message(ours: dict[str, ModuleType]) -> Any:
    pb, service = ours["evergreen_pb2"], ours["evergreen_service_pb2"]
    config = struct_pb2.Struct()
    config.update({"temperature": 0.5, "max_tokens": 64})
    return service.SessionMessage(
        actions=[
            pb.Action(
                name="GENERATE",
                inputs=[pb.NamedParameter(name="prompt", id="prompt_1")],
                outputs=[pb.NamedParameter(name="response", id="response_1")],
                configs=[packed(config)],
                target_spec=pb.TargetSpec(id="gemma"),
            )
        ],
        node_fragments=[
            pb.NodeFragment(id="prompt_1", child_ids=["question_1", "video_1"]),
            pb.NodeFragment(
                id="question_1",
                chunk_fragment=pb.Chunk(
                    metadata=pb.ChunkMetadata(
                        mimetype="text/plain",
                        role="user",
                        original_file_name="question.txt",
                        capture_time=timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=7),
                        experimental=[packed(struct_pb2.Value(string_value="x"))],
                    ),
                    data=b"Summarise this video: ",
                ),
            ),
            pb.NodeFragment(
                id="video_1",
                continued=True,
                chunk_fragment=pb.Chunk(
                    metadata=pb.ChunkMetadata(mimetype="video/mp4"), ref="file:///v/part1"
                ),
            ),
            pb.NodeFragment(id="video_1", seq=1, chunk_fragment=pb.Chunk(ref="file:///v/part2")),
            pb.NodeFragment(id="prompt_1_eot", chunk_fragment=pb.Chunk()),  # empty but present
        ],
    )


def fields(message: Any) -> dict[tuple[int, str], Any]:
    """The fields set in ``message``, by number and name, whatever classes it was parsed by."""

    def value(fd: Any, v: Any) -> Any:
        return fields(v) if fd.message_type is not None else v

    out: dict[tuple[int, str], Any] = {}
    for fd, v in message.ListFields():
        out[fd.number, fd.name] = [value(fd, x) for x in v] if fd.is_repeated else value(fd, v)
    return out


def test_bytes_written_by_ours_read_the_same_with_the_published_schema(
    ours: dict[str, ModuleType], upstream_session_message: Any
) -> None:
    mine = a_session_message(ours)
    wire = mine.SerializeToString(deterministic=True)
    theirs = upstream_session_message.FromString(wire)
    assert fields(theirs) == fields(mine)
    assert theirs.node_fragments[1].chunk_fragment.WhichOneof("payload") == "data"
    assert theirs.node_fragments[2].chunk_fragment.WhichOneof("payload") == "ref"
    assert theirs.node_fragments[4].HasField("chunk_fragment")
    assert not theirs.node_fragments[0].HasField("chunk_fragment")
    assert theirs.actions[0].configs[0].type_url == "type.googleapis.com/google.protobuf.Struct"
    back = theirs.SerializeToString(deterministic=True)
    assert back == wire
    again = ours["evergreen_service_pb2"].SessionMessage.FromString(back)
    assert again == mine


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(number: int, payload: bytes) -> bytes:  # a length-delimited field
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def vi(number: int, value: int) -> bytes:  # a varint field
    return varint(number << 3) + varint(value)


def test_the_encoding_follows_the_published_field_numbers(
    ours: dict[str, ModuleType], upstream_session_message: Any
) -> None:
    """Written out by hand from the published numbering: NodeFragment id=1 seq=2 continued=3
    child_ids=4 chunk_fragment=5; Chunk metadata=1 ref=3 data=10; ChunkMetadata mimetype=1
    role=2 original_file_name=3 capture_time=6 experimental=100; NamedParameter name=1 id=2;
    TargetSpec id=1; Action name=2 inputs=3 outputs=4 configs=5 target_spec=6 (1 reserved);
    SessionMessage node_fragments=1 actions=2."""
    pb, service = ours["evergreen_pb2"], ours["evergreen_service_pb2"]
    stamp = timestamp_pb2.Timestamp(seconds=5, nanos=6)
    extra = any_pb2.Any(type_url="t/x", value=b"\x01")
    message = service.SessionMessage(
        node_fragments=[
            pb.NodeFragment(
                id="a",
                seq=1,
                continued=True,
                chunk_fragment=pb.Chunk(
                    metadata=pb.ChunkMetadata(
                        mimetype="text/plain",
                        role="user",
                        original_file_name="f.txt",
                        capture_time=stamp,
                        experimental=[extra],
                    ),
                    data=b"hi",
                ),
            ),
            pb.NodeFragment(id="b", child_ids=["a", "c"]),
            pb.NodeFragment(id="c", chunk_fragment=pb.Chunk(ref="file:///c")),
        ],
        actions=[
            pb.Action(
                name="GENERATE",
                inputs=[pb.NamedParameter(name="prompt", id="b")],
                outputs=[pb.NamedParameter(name="response", id="r")],
                configs=[extra],
                target_spec=pb.TargetSpec(id="m"),
            )
        ],
    )
    any_bytes = ld(1, b"t/x") + ld(2, b"\x01")
    metadata = (
        ld(1, b"text/plain")
        + ld(2, b"user")
        + ld(3, b"f.txt")
        + ld(6, vi(1, 5) + vi(2, 6))
        + ld(100, any_bytes)
    )
    expected = (
        ld(1, ld(1, b"a") + vi(2, 1) + vi(3, 1) + ld(5, ld(1, metadata) + ld(10, b"hi")))
        + ld(1, ld(1, b"b") + ld(4, b"a") + ld(4, b"c"))
        + ld(1, ld(1, b"c") + ld(5, ld(3, b"file:///c")))
        + ld(
            2,
            ld(2, b"GENERATE")
            + ld(3, ld(1, b"prompt") + ld(2, b"b"))
            + ld(4, ld(1, b"response") + ld(2, b"r"))
            + ld(5, any_bytes)
            + ld(6, ld(1, b"m")),
        )
    )
    assert message.SerializeToString(deterministic=True) == expected
    assert service.SessionMessage.FromString(expected) == message
    theirs = upstream_session_message.FromString(expected)
    assert theirs.SerializeToString(deterministic=True) == expected
    assert fields(theirs) == fields(message)


def test_a_client_on_the_published_schema_holds_a_session_with_our_service(
    ours: dict[str, ModuleType], upstream_session_message: Any
) -> None:
    pb, service = ours["evergreen_pb2"], ours["evergreen_service_pb2"]
    stubs = ours["evergreen_service_pb2_grpc"]

    class Echo(stubs.EvergreenServiceServicer):  # type: ignore[misc,name-defined]
        """Answers each action with one text fragment in each of its outputs."""

        def StartSession(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
            for request in requests:
                for action in request.actions:
                    yield service.SessionMessage(
                        node_fragments=[
                            pb.NodeFragment(
                                id=out.id,
                                chunk_fragment=pb.Chunk(
                                    metadata=pb.ChunkMetadata(mimetype="text/plain"),
                                    data=f"{action.name} {action.target_spec.id}".encode(),
                                ),
                            )
                            for out in action.outputs
                        ]
                    )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    stubs.add_EvergreenServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            start = channel.stream_stream(
                METHOD,
                request_serializer=upstream_session_message.SerializeToString,
                response_deserializer=upstream_session_message.FromString,
            )
            request = upstream_session_message()
            action = request.actions.add(name="GENERATE")
            action.outputs.add(name="response", id="response_1")
            action.target_spec.id = "gemma"
            replies = list(start(iter([request]), timeout=10))
    finally:
        server.stop(None)
    assert len(replies) == 1
    (fragment,) = replies[0].node_fragments
    assert fragment.id == "response_1"
    assert fragment.chunk_fragment.metadata.mimetype == "text/plain"
    assert fragment.chunk_fragment.data == b"GENERATE gemma"
