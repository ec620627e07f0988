"""An evaluating process: ``python -m orchestratord.gates.worker MEMORY_MB``.

It reads requests from stdin and writes replies to stdout, each a 4-byte big-endian length
and a JSON object. A request is ``{"expr", "run", "facts"}``; a reply is ``{"value": bool}``,
``{"error": {"message", "details"}}`` (the expression failed), or ``{"memory": true}`` (its
address space, capped at MEMORY_MB, ran out: the process then exits, and the pool starts
another). cel-cpp evaluates holding the GIL and its values live in an arena until the
evaluation ends, so neither a thread nor a timeout in the server could bound it: a process
of its own can be capped (RLIMIT_AS) and killed (the pool's deadline).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any, BinaryIO

import orjson

from orchestrator_core.errors import OrchestratorError
from orchestrator_core.gates import compile_gate

_NICENESS = 10  # the server's event loop goes first on a busy machine


def main() -> None:
    limit = int(sys.argv[1]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # after the imports mapped
    os.nice(_NICENESS)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while True:
        request = _read(source)
        if request is None:
            return  # the pool closed its end
        reply, spent = _answer(request)
        body = orjson.dumps(reply)
        sink.write(len(body).to_bytes(4, "big") + body)
        sink.flush()
        if spent:
            return


def _read(source: BinaryIO) -> bytes | None:
    head = source.read(4)
    if len(head) < 4:
        return None
    body = source.read(int.from_bytes(head, "big"))
    return body if len(body) == int.from_bytes(head, "big") else None


def _answer(request: bytes) -> tuple[dict[str, Any], bool]:
    """The reply, and whether this process is spent (its memory ran out once: a fresh one
    starts from a clean heap)."""
    try:
        body = _loads(request)
        gate = compile_gate(body["expr"])
        return {"value": gate.evaluate(body["facts"], body["run"])}, False
    except OrchestratorError as exc:
        return {"error": {"message": exc.message, "details": exc.details}}, False
    except MemoryError:
        return {"memory": True}, True
    except Exception as exc:  # a value the runtime cannot take (an integer past 64 bits)
        message = f"the expression could not be evaluated: {exc}"
        return {"error": {"message": message, "details": {"reason": "runtime"}}}, False


def _loads(request: bytes) -> Any:
    try:
        return orjson.loads(request)
    except orjson.JSONDecodeError:  # a NaN or a big integer, as the database codec keeps them
        return json.loads(request)


if __name__ == "__main__":
    main()
