"""An action's input as a step's prompt: a node tree flattened depth-first into chunks.

- ``text/*`` chunks are text (UTF-8); their concatenation is the prompt.
- ``role`` metadata turns consecutive chunks into chat messages: chunks of one role form one
  message; the server's own responses carry role ``model`` (an ``assistant`` message). Once
  any chunk names a role, the input is a conversation and chunks with none are ``user``'s.
- An ``EndOfTurn`` chunk (``application/x-protobuf; type=EndOfTurn``) ends the message it is
  in: the next chunk starts a new one, even of the same role.
- Any other mime type is refused naming it (``INVALID_ARGUMENT``).
"""

from __future__ import annotations

from typing import Any

from orchestratord.evergreen.nodes import Leaf, SessionAbort

END_OF_TURN = "application/x-protobuf; type=EndOfTurn"
MODEL_ROLE = "model"  # the role of what the server produces
_ROLES = {"user": "user", "system": "system", "model": "assistant", "assistant": "assistant"}


def _is_end_of_turn(mimetype: str) -> bool:
    return mimetype.replace(" ", "").lower() == END_OF_TURN.replace(" ", "").lower()


def _text(leaf: Leaf, param: str) -> str:
    if leaf.ref is not None:  # read before (refs.py): here only if nothing read it
        raise SessionAbort(
            "UNIMPLEMENTED", f"input {param!r}: node {leaf.node_id!r} is an unread reference"
        )
    if not leaf.mimetype.lower().startswith("text/"):
        raise SessionAbort(
            "INVALID_ARGUMENT",
            f"input {param!r}: node {leaf.node_id!r} is {leaf.mimetype!r}; this action takes"
            f" text/* chunks and {END_OF_TURN!r}",
        )
    try:
        return leaf.data.decode()
    except UnicodeDecodeError:
        raise SessionAbort(
            "INVALID_ARGUMENT", f"input {param!r}: node {leaf.node_id!r} is not UTF-8 text"
        ) from None


def _role(leaf: Leaf, param: str) -> str | None:
    if not leaf.role:
        return None
    role = _ROLES.get(leaf.role.lower())
    if role is None:
        raise SessionAbort(
            "INVALID_ARGUMENT",
            f"input {param!r}: node {leaf.node_id!r} has role {leaf.role!r} "
            f"(roles: {', '.join(sorted(_ROLES))})",
        )
    return role


def llm_input(leaves: list[Leaf], param: str) -> dict[str, Any]:
    """``{"prompt": ...}``, or ``{"messages": [...]}`` once a chunk names a role."""
    conversation = any(leaf.role for leaf in leaves)
    if not conversation:
        text = "".join(_text(leaf, param) for leaf in leaves if not _is_end_of_turn(leaf.mimetype))
        return {"prompt": text}
    messages: list[dict[str, str]] = []
    open_role: str | None = None  # the role of the message still taking chunks
    for leaf in leaves:
        if _is_end_of_turn(leaf.mimetype):
            open_role = None
            continue
        role = _role(leaf, param) or "user"
        text = _text(leaf, param)
        if open_role == role:
            messages[-1]["content"] += text
        else:
            messages.append({"role": role, "content": text})
            open_role = role
    if not messages:
        raise SessionAbort("INVALID_ARGUMENT", f"input {param!r} holds no text")
    return {"messages": messages}
