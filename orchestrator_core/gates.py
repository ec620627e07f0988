"""Gates: CEL expressions over a run's facts, compiled once and evaluated with limits.

The runtime is Google's CEL implementation through its Python bindings (the PyPI package
``cel-expr-python``, cel-cpp underneath): the reference implementation of the language,
maintained by the CEL team, type-checking at compile time with positions in its errors.

Variables: ``facts``, a list of ``{type, data, step_id, ts}`` in append order, and ``run``,
``{run_id, usage, budgets}``. An expression that does not parse or check (an unknown name, a
type that cannot be boolean) is refused at submission with its line and column; one whose
value at run time is not a boolean (or that fails: a missing key) is a step error.
Limits: expressions of at most ``MAX_EXPR_CHARS`` characters, evaluated over at most
``MAX_FACTS`` facts (the latest ones), and the runtime's own cost limit: 10,000 comprehension
iterations per evaluation, shared by every macro of the expression (past it the evaluation
fails with ``reason: "budget"``). The runtime bounds no value's size, so an expression is
also estimated (``orchestrator_core.cel_cost``): one that may build more than
``MAX_INPUT_COPIES`` times what it reads, or ``MAX_FIXED_BYTES`` whatever it reads, is
refused at submission (``reason: "cost"``, with the position of the node that builds it),
and ``check_cost`` refuses an evaluation whose estimate over its actual facts passes the
server's limit. The runtime holds the GIL while it evaluates, so a thread and a timeout
could not bound it: the server evaluates in processes of its own, capped in memory and
time (``orchestratord/gates/``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel

from orchestrator_core.cel_cost import Estimate, estimate
from orchestrator_core.errors import InvalidParams, OrchestratorError

MAX_EXPR_CHARS = 4096
MAX_FACTS = 9_999  # one ``exists`` over all of them fits the iteration budget
MAX_INPUT_COPIES = 64  # bytes an expression may build, in multiples of what it reads...
MAX_FIXED_BYTES = 64 << 20  # ...and whatever it reads (literals over literal ranges)
_CACHE_SIZE = 256
_POSITION = re.compile(r"<input>:(\d+):(\d+): ([^\n]*)")

_env = cel.NewEnv(variables={"facts": cel.Type.List(cel.Type.DYN), "run": cel.Type.DYN})
_compiled: OrderedDict[str, Gate] = OrderedDict()


class GateExprInvalid(OrchestratorError):
    """422 at submission (it does not compile); a step error when its value is not bool."""

    code = "GATE_EXPR_INVALID"


@dataclass(frozen=True)
class Gate:
    expr: str
    program: Any
    cost: Estimate

    def evaluate(self, facts: list[dict[str, Any]], run: dict[str, Any]) -> bool:
        """The expression's value, or ``GateExprInvalid`` when it is no boolean."""
        try:
            value = self.program.eval(data={"facts": facts[-MAX_FACTS:], "run": run})
        except RuntimeError as exc:  # the runtime's iteration budget, raised not returned
            raise GateExprInvalid(
                f"the expression passed the evaluation budget: {exc}",
                details={"expr": self.expr, "reason": "budget"},
            ) from None
        kind = value.type().name().lower()
        if kind == "bool":
            return bool(value.value())
        if kind == "*error*" or kind == "error":
            raise GateExprInvalid(
                f"the expression failed: {value.value()}", details={"expr": self.expr}
            )
        raise GateExprInvalid(
            f"the expression gave a {kind}, not a bool",
            details={"expr": self.expr, "type": kind},
        )


def compile_gate(expr: str, *, field: str = "input.expr") -> Gate:
    """Parse and check ``expr``; errors name the field, the line and the column."""
    found = _compiled.get(expr)
    if found is not None:
        _compiled.move_to_end(expr)
        return found
    if len(expr) > MAX_EXPR_CHARS:
        raise InvalidParams(f"longer than {MAX_EXPR_CHARS} characters", field=field)
    try:
        program = _env.compile(expr)
    except RuntimeError as exc:
        raise _invalid(str(exc), field) from None
    kind = program.return_type().name().lower()
    if kind not in ("bool", "dyn"):
        raise GateExprInvalid(
            f"{field}: the expression is a {kind}, not a bool",
            details={"field": field, "type": kind, "line": 1, "column": 1},
        )
    cost = estimate(program.serialize(), max_copies=MAX_INPUT_COPIES, max_fixed=MAX_FIXED_BYTES)
    if cost.copies > MAX_INPUT_COPIES or cost.fixed > MAX_FIXED_BYTES:
        raise _too_costly(cost, field)
    gate = Gate(expr, program, cost)
    _compiled[expr] = gate
    if len(_compiled) > _CACHE_SIZE:
        _compiled.popitem(last=False)
    return gate


def check_cost(gate: Gate, input_bytes: int, max_value_bytes: int) -> None:
    """Refuse to evaluate ``gate`` over an input of ``input_bytes`` (its variables' JSON)
    when it may build more than ``max_value_bytes``."""
    bound = gate.cost.bytes_for(input_bytes)
    if bound > max_value_bytes:
        raise GateExprInvalid(
            f"the expression may build {bound / (1 << 20):,.0f} MiB over these facts"
            f" ({input_bytes:,} bytes), past the limit of {max_value_bytes / (1 << 20):,.0f} MiB",
            details={
                "expr": gate.expr,
                "reason": "cost",
                "estimate_bytes": int(bound),
                "limit_bytes": max_value_bytes,
            },
        )


def _too_costly(cost: Estimate, field: str) -> GateExprInvalid:
    where = f"(line {cost.line}, column {cost.column})"
    return GateExprInvalid(
        f"{field}: the expression may build {cost.copies:,.0f} times what it reads"
        f" (at most {MAX_INPUT_COPIES}) and {cost.fixed / (1 << 20):,.1f} MiB besides"
        f" (at most {MAX_FIXED_BYTES >> 20}) {where}",
        details={
            "field": field,
            "reason": "cost",
            "line": cost.line,
            "column": cost.column,
            "copies": cost.copies,
            "fixed_bytes": int(cost.fixed),
        },
    )


def _invalid(text: str, field: str) -> GateExprInvalid:
    errors = [
        {"line": int(line), "column": int(col), "message": msg.strip()}
        for line, col, msg in _POSITION.findall(text)
    ]
    first = errors[0] if errors else {"line": 1, "column": 1, "message": text}
    return GateExprInvalid(
        f"{field}: {first['message']} (line {first['line']}, column {first['column']})",
        details={"field": field, **first, "errors": errors or [first]},
    )
