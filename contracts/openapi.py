"""Export the OpenAPI document of the server: ``python -m contracts.openapi [--check]``.

The document is committed as ``contracts/openapi.json``; ``--check`` fails when it drifted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from contracts.generated import write_or_check

PATH = Path(__file__).with_name("openapi.json")


def render() -> str:
    from orchestratord.api.app import create_app  # the server builds it; contracts keeps it

    doc: dict[str, Any] = create_app().openapi()
    add_event_schemas(doc)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def add_event_schemas(doc: dict[str, Any]) -> None:
    """The SSE payloads (``data:`` of each event type) as components, so clients generate
    them too: ``<Type>Event`` schemas and ``x-sse-events`` mapping event names to them."""
    from pydantic.json_schema import models_json_schema

    from contracts.events import STEP_EVENTS

    _, defs = models_json_schema(
        [(m, "serialization") for m in STEP_EVENTS], ref_template="#/components/schemas/{model}"
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    doc["x-sse-events"] = {
        m.event_type: {"$ref": f"#/components/schemas/{m.__name__}"} for m in STEP_EVENTS
    }


def main(argv: list[str]) -> int:
    return write_or_check(PATH, render(), argv, module="contracts.openapi")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
