"""Our engine schemas against the published ones: same services, methods, messages, fields
and enums (names, numbers, types, labels), so both sides read each other's bytes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

from contracts.protos import build, load

SEEDS = Path("/work/shared/seeds")
PAIRS = [("kakeya_runtime.proto", "kakeya-runtime.proto"), ("salience.proto", "salience.proto")]
# The stored copy of the Salience schema lost its line breaks and had them restored by a
# script (its header says so): an enum value that followed a trailing comment ended up on
# the comment's line, e.g. "// emitted EOS / stop token FINISH_REASON_LENGTH = 2;".
_DECLARATION_IN_COMMENT = re.compile(
    r"^(\s*//.*?)\s+([A-Z][A-Z0-9_]*\s*=\s*\d+\s*;)\s*$", re.MULTILINE
)


def restore_declarations(text: str) -> str:
    return _DECLARATION_IN_COMMENT.sub(r"\2\n\1", text)


def compiled(path: Path) -> descriptor_pb2.FileDescriptorProto:
    files = descriptor_pb2.FileDescriptorSet.FromString(build.descriptor_set([path])).file
    assert len(files) == 1
    return files[0]


def shape(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    def enum(e: descriptor_pb2.EnumDescriptorProto) -> dict[str, int]:
        return {v.name: v.number for v in e.value}

    def message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
        oneofs = [o.name for o in m.oneof_decl]
        return {
            "fields": {
                f.name: (
                    f.number,
                    f.type,
                    f.label,
                    f.type_name,
                    oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
                    f.proto3_optional,
                )
                for f in m.field
            },
            "messages": {n.name: message(n) for n in m.nested_type},
            "enums": {e.name: enum(e) for e in m.enum_type},
        }

    return {
        "package": fd.package,
        "syntax": fd.syntax,
        "services": {
            s.name: {
                m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in s.method
            }
            for s in fd.service
        },
        "messages": {m.name: message(m) for m in fd.message_type},
        "enums": {e.name: enum(e) for e in fd.enum_type},
    }


@pytest.fixture
def seed_dir(tmp_path: Path) -> Path:
    if not SEEDS.is_dir():
        pytest.skip(f"the published schemas are not here ({SEEDS} is absent)")
    for _, seed in PAIRS:
        (tmp_path / seed).write_text(restore_declarations((SEEDS / seed).read_text()))
    return tmp_path


@pytest.mark.parametrize(("ours", "seed"), PAIRS)
def test_schema_matches_the_published_one(seed_dir: Path, ours: str, seed: str) -> None:
    mine = shape(compiled(build.PROTO_DIR / ours))
    theirs = shape(compiled(seed_dir / seed))
    assert mine["services"], "no service compiled"
    assert mine == theirs


def test_restoring_declarations_only_moves_commented_enum_values() -> None:
    text = "  // emitted EOS / stop token FINISH_REASON_LENGTH = 2;\n  // hit max_tokens\n"
    assert restore_declarations(text) == (
        "FINISH_REASON_LENGTH = 2;\n  // emitted EOS / stop token\n  // hit max_tokens\n"
    )
    assert restore_declarations("// see field = 2 of x\n") == "// see field = 2 of x\n"


def test_generated_modules_are_current_and_usable() -> None:
    protos = load()
    assert build.is_current()
    request = protos.kakeya.GenerateRequest(session_id="s", max_tokens=3, seed=0)
    assert request.HasField("seed") and not request.HasField("temperature")
    length = protos.salience.GenerateDone.FINISH_REASON_LENGTH
    done = protos.salience.GenerateDone(finish_reason=length, completion_tokens=3)
    assert protos.salience.GenerateDone.FromString(done.SerializeToString()) == done
    assert hasattr(protos.kakeya_grpc, "RuntimeServiceStub")
    assert hasattr(protos.salience_grpc, "add_SalienceServicer_to_server")


def test_a_changed_schema_makes_the_build_stale(tmp_path: Path) -> None:
    for name in build.SOURCES:
        (tmp_path / name).write_bytes((build.PROTO_DIR / name).read_bytes())
    before = build.source_digest(tmp_path)
    (tmp_path / build.SOURCES[0]).write_text(
        (tmp_path / build.SOURCES[0]).read_text() + "\n// changed\n"
    )
    assert build.source_digest(tmp_path) != before
    assert build.source_digest(build.PROTO_DIR) == build.source_digest()
