"""What an expression may build, estimated before it runs (``orchestrator_core.cel_cost``)
and the rules built on it (``orchestrator_core.gates``): refused at submission past
``MAX_INPUT_COPIES`` copies of its input, with the position of the node that builds them;
refused at run time when the estimate over the actual facts passes the server's limit.
Each case is data: the expression, and the copies and fixed bytes it is held to."""

from __future__ import annotations

import pytest

from orchestrator_core import gates
from orchestrator_core.cel_cost import ITERATIONS, estimate
from orchestrator_core.errors import OrchestratorError
from orchestrator_core.gates import MAX_INPUT_COPIES, check_cost, compile_gate

R48 = str(list(range(48)))
R32 = str(list(range(32)))
ISSUE = f"{R48}.map(x, {R32}.map(y, facts[0].data.s + facts[0].data.s)).size() > 0"
CHAIN_20 = "size(" + " + ".join(["facts[0].data.s"] * 20) + ") > 0"


def cost(expr: str) -> tuple[float, float]:
    program = gates._env.compile(expr)
    found = estimate(program.serialize())
    return found.copies, found.fixed


@pytest.mark.parametrize(
    ("expr", "copies"),
    [
        # what gates are written for: reading, comparing, counting build nothing sized
        ('facts.exists(f, f.type == "score" && f.data.value > 5)', 0),
        ("run.usage.tokens_out < run.budgets.max_tokens_out", 0),
        ("facts.exists(a, facts.exists(b, a.data == b.data + 1000))", 0),  # int + int
        ("true", 0),
        # a filter's list holds its elements: at most the facts once
        ('facts.filter(f, f.type == "x").size() > 2', 1),
        # a variable summed over its range is the range: each fact concatenated once
        ('facts.map(f, f.type + ":").size() > 0', 2),
        ('facts.exists(f, f.data.items.exists(i, i.tags.exists(t, t + "" == "x")))', 1),
        # a value read outside the loop is paid at each iteration of a literal range
        ('[1, 2, 3].exists(i, facts[0].data.s + "x" == "y")', 3),
        # a chain re-copies what it built: 2 + 3 + ... + 20
        (CHAIN_20, 209),
    ],
)
def test_copies_of_the_input(expr: str, copies: float) -> None:
    assert cost(expr)[0] == copies


def test_the_issues_expression_builds_thousands_of_copies() -> None:
    """48 x 32 concatenations of twice the fact, each kept in the lists built."""
    copies, _ = cost(ISSUE)
    assert copies >= 48 * 32 * 2


def test_nested_comprehensions_share_the_iteration_budget() -> None:
    """A value read outside both loops is paid at most ``ITERATIONS`` times in all (the
    runtime stops past them), not the product of two ranges of ``ITERATIONS`` each; a
    variable of the outer range is paid at each inner iteration."""
    outer_invariant = 'facts.exists(f, facts.exists(g, facts[0].data.s + "" == ""))'
    assert cost(outer_invariant)[0] == ITERATIONS
    both = 'facts.exists(f, facts.exists(g, f.data.s + g.data.s == ""))'
    assert cost(both)[0] == 2 * ITERATIONS


def test_literals_over_literal_ranges_are_fixed_bytes() -> None:
    expr = f'{list(range(10))}.all(x, {list(range(10))}.all(y, "{"a" * 40}" + string(y) != ""))'
    copies, fixed = cost(expr)
    assert copies == 0 and 100 * 40 <= fixed < 100 * 200


@pytest.mark.parametrize(
    ("expr", "column"),
    [
        (ISSUE, ISSUE.index("+") + 1),  # the concatenation, run 1,536 times
        # the tenth +: 2 + 3 + ... + 11 = 65 copies, the first past 64
        (CHAIN_20, [i for i, c in enumerate(CHAIN_20) if c == "+"][9] + 1),
    ],
)
def test_an_expression_that_builds_past_the_limit_is_refused_where_it_does(
    expr: str, column: int
) -> None:
    with pytest.raises(OrchestratorError) as caught:
        compile_gate(expr, field="steps[2].input.expr")
    exc = caught.value
    assert exc.code == "GATE_EXPR_INVALID"
    details = exc.details
    assert details["field"] == "steps[2].input.expr" and details["reason"] == "cost"
    assert (details["line"], details["column"]) == (1, column)
    assert details["copies"] > MAX_INPUT_COPIES
    assert exc.message.startswith("steps[2].input.expr: the expression may build ")
    assert exc.message.endswith(f"(line 1, column {column})")


def test_a_refusal_names_the_line_of_a_multiline_expression() -> None:
    expr = "true &&\n  " + CHAIN_20
    with pytest.raises(OrchestratorError) as caught:
        compile_gate(expr)
    assert caught.value.details["line"] == 2


@pytest.mark.parametrize(("input_bytes", "refused"), [(1 << 20, False), (3 << 20, True)])
def test_an_evaluation_is_refused_when_its_estimate_over_its_facts_passes_the_limit(
    input_bytes: int, refused: bool
) -> None:
    """``[0..23]`` x twice the fact: 48 copies and more; 1 MiB of facts fits 128 MiB, 3 do
    not."""
    gate = compile_gate(f'{list(range(24))}.exists(i, facts[0].data.s + facts[0].data.s == "")')
    limit = 128 << 20
    if not refused:
        check_cost(gate, input_bytes, limit)
        return
    with pytest.raises(OrchestratorError) as caught:
        check_cost(gate, input_bytes, limit)
    details = caught.value.details
    assert caught.value.code == "GATE_EXPR_INVALID"
    assert details["reason"] == "cost" and details["limit_bytes"] == limit
    assert details["estimate_bytes"] > limit and details["expr"] == gate.expr
