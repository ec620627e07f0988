"""Gates' rules alone (orchestrator_core.gates): ``compile_gate`` admits an expression at
submission or refuses it, ``Gate.evaluate`` decides it over a run's facts. A fixture builds
the run's context; parametrized over the facts' states, each outcome is data: the gate's
value, or the error body a step or a submission would carry."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core import gates
from orchestrator_core.errors import OrchestratorError
from orchestrator_core.gates import MAX_EXPR_CHARS, MAX_FACTS, compile_gate


def fact(kind: str, data: Any, i: int = 0) -> dict[str, Any]:
    return {"type": kind, "data": data, "step_id": f"step_{i}", "ts": f"2026-01-01T00:00:{i:02d}Z"}


# the run's facts, by state
FACTS: dict[str, list[dict[str, Any]]] = {
    "none": [],
    "low score": [fact("score", {"value": 3})],
    "high score": [fact("score", {"value": 7}), fact("note", {"text": "hi"}, 1)],
    "done": [fact("score", {"value": 3}), fact("done", True, 1)],
}


@pytest.fixture
def run() -> dict[str, Any]:
    """The ``run`` variable: its id, usage and budgets, as the gate step gives them."""
    return {
        "run_id": "run_a",
        "usage": {"tokens_in": 12, "tokens_out": 30, "cost_usd": 0.5},
        "budgets": {"max_tokens_out": 100},
    }


def evaluated(expr: str, facts: list[dict[str, Any]], run: dict[str, Any]) -> Any:
    """The gate's outcome as data: ``{"value": ...}``, or the error's code and details."""
    try:
        return {"value": compile_gate(expr).evaluate(facts, run)}
    except OrchestratorError as exc:
        return {"code": exc.code, "details": exc.details}


def refused(expr: str, field: str = "input.expr") -> dict[str, Any]:
    """``compile_gate``'s refusal as data: its code and details but the runtime's wording."""
    try:
        compile_gate(expr, field=field)
    except OrchestratorError as exc:
        details = {k: v for k, v in exc.details.items() if k not in ("message", "errors")}
        return {"code": exc.code, "details": details, "message": exc.message}
    raise AssertionError(f"compiled: {expr}")


_SCORE_ABOVE_5 = 'facts.exists(f, f.type == "score" && f.data.value > 5)'
_DONE = 'facts.exists(f, f.type == "done")'


@pytest.mark.parametrize(
    ("state", "expr", "value"),
    [
        ("none", _SCORE_ABOVE_5, False),
        ("low score", _SCORE_ABOVE_5, False),
        ("high score", _SCORE_ABOVE_5, True),
        ("done", _SCORE_ABOVE_5, False),
        ("none", _DONE, False),
        ("high score", _DONE, False),
        ("done", _DONE, True),
        ("none", "size(facts) == 0", True),
        ("high score", "size(facts) == 2", True),
        ("done", "size(facts) == 0", False),
        ("none", 'run.run_id == "run_a"', True),
        ("none", "run.usage.tokens_out < run.budgets.max_tokens_out", True),
        ("done", "run.usage.tokens_out > run.budgets.max_tokens_out", False),
    ],
)
def test_a_gate_is_true_or_false_over_the_runs_facts(
    run: dict[str, Any], state: str, expr: str, value: bool
) -> None:
    assert evaluated(expr, FACTS[state], run) == {"value": value}


@pytest.mark.parametrize("state", list(FACTS))
@pytest.mark.parametrize(
    ("expr", "kind"),
    [("run.usage.tokens_in", "int"), ("run.run_id", "string"), ("run.usage", "map<dyn, dyn>")],
)
def test_a_value_that_is_no_boolean_is_a_step_error_naming_its_type(
    run: dict[str, Any], state: str, expr: str, kind: str
) -> None:
    """It compiles (a ``dyn`` may be a bool), and fails when its value is known."""
    assert evaluated(expr, FACTS[state], run) == {
        "code": "GATE_EXPR_INVALID",
        "details": {"expr": expr, "type": kind},
    }


@pytest.mark.parametrize("state", ["none", "high score"])
@pytest.mark.parametrize("expr", ["run.nothing == 1", 'facts.all(f, f.data.missing == "x")'])
def test_an_evaluation_that_fails_is_a_step_error(
    run: dict[str, Any], state: str, expr: str
) -> None:
    """A missing key fails the evaluation (``all`` over no facts never reads one)."""
    got = evaluated(expr, FACTS[state], run)
    if expr.startswith("facts.all") and not FACTS[state]:
        assert got == {"value": True}
    else:
        assert got == {"code": "GATE_EXPR_INVALID", "details": {"expr": expr}}


def test_an_evaluation_past_the_runtimes_budget_is_a_step_error(run: dict[str, Any]) -> None:
    """200 facts: 40,000 iterations of the nested comprehension, past the 9,999 allowed."""
    expr = "facts.all(f, facts.all(g, true))"
    assert evaluated(expr, [fact("a", i) for i in range(200)], run) == {
        "code": "GATE_EXPR_INVALID",
        "details": {"expr": expr, "reason": "budget"},
    }
    assert evaluated(expr, [fact("a", i) for i in range(99)], run) == {"value": True}


def test_only_the_latest_facts_are_evaluated(run: dict[str, Any]) -> None:
    """Past ``MAX_FACTS`` facts, the oldest are not seen."""
    facts = [fact("first", 0)] + [fact("n", i) for i in range(MAX_FACTS)]
    assert evaluated("size(facts)" + f" == {MAX_FACTS}", facts, run) == {"value": True}
    assert evaluated('facts.exists(f, f.type == "first")', facts, run) == {"value": False}
    assert evaluated('facts.exists(f, f.type == "first")', facts[:-1], run) == {"value": True}


@pytest.mark.parametrize(
    ("expr", "line", "column"),
    [
        ("facts.exists(f, f.type == ", 1, 27),
        ("1 +", 1, 4),
        ("nope && true", 1, 1),
        ("true &&\n", 2, 1),
        ("true &&\n  nope", 2, 3),
    ],
)
@pytest.mark.parametrize("field", ["input.expr", "steps[1].input.expr"])
def test_an_expression_that_does_not_compile_is_refused_with_its_position(
    expr: str, line: int, column: int, field: str
) -> None:
    got = refused(expr, field)
    assert got["code"] == "GATE_EXPR_INVALID"
    assert got["details"] == {"field": field, "line": line, "column": column}
    assert got["message"].startswith(f"{field}: ")
    assert got["message"].endswith(f"(line {line}, column {column})")


@pytest.mark.parametrize(("expr", "kind"), [("size(facts)", "int"), ('"yes"', "string")])
def test_an_expression_known_to_be_no_boolean_is_refused(expr: str, kind: str) -> None:
    assert refused(expr) == {
        "code": "GATE_EXPR_INVALID",
        "details": {"field": "input.expr", "type": kind, "line": 1, "column": 1},
        "message": f"input.expr: the expression is a {kind}, not a bool",
    }


@pytest.mark.parametrize(("padding", "admitted"), [(0, True), (1, False)])
def test_an_expression_is_at_most_max_expr_chars_long(padding: int, admitted: bool) -> None:
    expr = "true" + " " * (MAX_EXPR_CHARS - 4 + padding)
    if admitted:
        assert compile_gate(expr).expr == expr
    else:
        assert refused(expr) == {
            "code": "INVALID_PARAMS",
            "details": {},
            "message": f"input.expr: longer than {MAX_EXPR_CHARS} characters",
        }


def test_an_expression_compiles_once_while_it_is_among_the_latest_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache keeps the 256 latest used; a use keeps one among them."""
    monkeypatch.setattr(gates, "_compiled", type(gates._compiled)())
    first = compile_gate("1 == 1")
    assert compile_gate("1 == 1") is first
    for i in range(255):
        compile_gate(f"{i} == {i}")
    assert compile_gate("1 == 1") is first  # used again: now the latest
    for i in range(255, 511):
        compile_gate(f"{i} == {i}")
    assert compile_gate("1 == 1") is not first  # pushed out by 256 others: compiled again
