"""gRPC schemas: the session-bound engine protocols (Kakeya, Salience) and Evergreen (the
front door's and its engines': ``evergreen.v2``, with our own action configs).

``load()`` returns the generated modules, building them first when missing or stale (see
``build``). The generated code is untyped; adapters treat its messages as ``Any`` and keep
them inside their own module.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

from contracts.protos.build import ensure_built


@dataclass(frozen=True)
class Protos:
    kakeya: ModuleType  # messages of kakeya.v1
    kakeya_grpc: ModuleType  # RuntimeServiceStub, RuntimeServiceServicer, add_..._to_server
    salience: ModuleType  # messages of salience.v1
    salience_grpc: ModuleType  # SalienceStub, SalienceServicer, add_..._to_server
    evergreen: ModuleType  # evergreen.v2: NodeFragment, Chunk, Action, ...
    evergreen_service: ModuleType  # evergreen.v2: SessionMessage
    evergreen_grpc: ModuleType  # EvergreenServiceStub, EvergreenServiceServicer, add_...
    evergreen_config: ModuleType  # orchestratord.evergreen.v1: GenerateConfig


@functools.cache
def load() -> Protos:
    ensure_built()
    importlib.invalidate_caches()

    def mod(name: str) -> ModuleType:
        return importlib.import_module(f"contracts.protos.gen.{name}")

    return Protos(
        kakeya=mod("kakeya_runtime_pb2"),
        kakeya_grpc=mod("kakeya_runtime_pb2_grpc"),
        salience=mod("salience_pb2"),
        salience_grpc=mod("salience_pb2_grpc"),
        evergreen=mod("evergreen_pb2"),
        evergreen_service=mod("evergreen_service_pb2"),
        evergreen_grpc=mod("evergreen_service_pb2_grpc"),
        evergreen_config=mod("orchestratord_evergreen_pb2"),
    )


__all__ = ["Protos", "load"]
