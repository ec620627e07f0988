"""What a CEL expression may build, read from its checked syntax tree before it runs.

cel-cpp bounds the iterations of an evaluation (10,000, every comprehension together) but
not the size of the values it builds: ``[0, ..., 47].map(x, [0, ..., 31].map(y, s + s))``
is 1,536 iterations, each making a new string twice the size of ``s``; over a 2 MB fact
that is 6 GB. Its Python binding exposes neither a cost limit nor a value-size limit, so
the bound is estimated here from the checked expression (``Expression.serialize()``, a
``cel.expr.CheckedExpr``) and enforced at run time by the evaluating process's own limits.

The estimate counts the bytes the expression allocates as ``copies x input + fixed``: input
is the JSON size of what the expression reads (``facts`` and ``run``), so ``copies`` is a
property of the expression alone. What allocates: concatenation (``+`` on strings, bytes
or lists: the sum of its operands), ``string()``/``bytes()`` conversions, and list and map
literals (16 bytes an element: elements are references). A value read from the input
(``facts[0].data.s``) is at most the input; an iteration variable over a range is at most
its element, and summed over the range's iterations at most the range: so
``facts.map(f, f.type + ":")`` is one copy, but the same concatenation of a fixed value
repeated over a literal range is one copy per iteration. Iterations are the range's
length when it is a literal, else the runtime's budget, and nested comprehensions share
the budget. What the estimate leaves to the run-time bounds: the runtime copies a
``map``'s or ``filter``'s accumulated list at each step (quadratic in the range, which
is the facts' count, unknown before the run), and the time of operations that do not
allocate (``contains`` over long strings).

The wire format is read by field number (``proto/cel/expr/syntax.proto`` and
``checked.proto`` of cel-spec; field numbers never change).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

ITERATIONS = 10_000  # cel-cpp's RuntimeOptions.comprehension_max_iterations (not settable)
ELEMENT_BYTES = 16  # a list element or a map entry: a reference
INPUT = "input"
_ONE = "1"
_CONCAT_OVERLOADS = frozenset({"add_string", "add_bytes", "add_list"})
_CONVERSIONS = frozenset({"string", "bytes"})

Form = dict[str, float]  # bytes as a sum: coefficient x symbol ("1", INPUT, a variable)


@dataclass(frozen=True)
class Estimate:
    """Bytes an evaluation may allocate: ``copies`` x the input's bytes + ``fixed``. The
    line and column are those of the first node (innermost first) past the limit asked."""

    copies: float
    fixed: float
    line: int = 1
    column: int = 1

    def bytes_for(self, input_bytes: int) -> float:
        return self.copies * input_bytes + self.fixed


@dataclass
class _Node:
    size: Form  # the value's bytes, once
    alloc: Form  # bytes allocated to compute it, once


@dataclass
class _Walk:
    refs: dict[int, tuple[str, frozenset[str]]]
    positions: dict[int, int]
    max_copies: float
    max_fixed: float
    culprit: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # CEL variable -> its symbol
    var_total: dict[str, Form] = field(default_factory=dict)  # symbol -> its range's size

    def flag(self, expr_id: int, alloc: Form, runs: float) -> None:
        """Remember the first node (innermost) whose allocations, over its runs, pass; a
        node whose allocations depend on an iteration variable is judged by its
        comprehension, where the variable's iterations sum to its range."""
        if self.culprit is not None or any(k in self.var_total for k in alloc):
            return
        copies, fixed = alloc.get(INPUT, 0.0) * runs, alloc.get(_ONE, 0.0) * runs
        if copies > self.max_copies or fixed > self.max_fixed:
            self.culprit = expr_id


def estimate(
    serialized: bytes, *, max_copies: float = float("inf"), max_fixed: float = float("inf")
) -> Estimate:
    """The estimate of a checked expression (``Expression.serialize()``)."""
    checked = _fields(_as_bytes(_fields(serialized)[2][0]))  # protobuf Any{type_url, value}
    walk = _Walk(_references(checked), _positions(checked), max_copies, max_fixed)
    root = _as_bytes(checked[4][0])
    node = _expr(walk, root, runs=1.0)
    walk.flag(_id(root), node.alloc, 1.0)
    line, column = _line_column(checked, walk.positions.get(walk.culprit or _id(root), 0))
    return Estimate(node.alloc.get(INPUT, 0.0), node.alloc.get(_ONE, 0.0), line, column)


# --- the syntax tree ------------------------------------------------------------------------


def _expr(walk: _Walk, raw: bytes, runs: float) -> _Node:
    f = _fields(raw)
    if 3 in f:
        return _constant(_fields(_as_bytes(f[3][0])))
    if 4 in f:
        return _ident(walk, _text(_fields(_as_bytes(f[4][0]))[1][0]))
    if 5 in f:
        sel = _fields(_as_bytes(f[5][0]))
        operand = _expr(walk, _as_bytes(sel[1][0]), runs)
        if sel.get(3) and sel[3][0]:  # has(): a boolean
            return _Node({_ONE: ELEMENT_BYTES}, operand.alloc)
        return _Node(operand.size, operand.alloc)  # a part of the operand
    if 6 in f:
        return _call(walk, _id(raw), _fields(_as_bytes(f[6][0])), runs)
    if 7 in f:
        items = [_expr(walk, _as_bytes(e), runs) for e in _fields(_as_bytes(f[7][0])).get(1, [])]
        return _collection(items, len(items))
    if 8 in f:
        entries = [_fields(_as_bytes(e)) for e in _fields(_as_bytes(f[8][0])).get(2, [])]
        parts = [_expr(walk, _as_bytes(e[k][0]), runs) for e in entries for k in (3, 4) if k in e]
        return _collection(parts, len(entries))
    if 9 in f:
        return _comprehension(walk, _id(raw), _fields(_as_bytes(f[9][0])), runs)
    return _Node({_ONE: ELEMENT_BYTES}, {})


def _constant(c: dict[int, list[int | bytes]]) -> _Node:
    for number in (6, 7):  # string, bytes: folded once, not allocated by the evaluation
        if number in c:
            return _Node({_ONE: float(len(_as_bytes(c[number][0])))}, {})
    return _Node({_ONE: ELEMENT_BYTES}, {})


def _ident(walk: _Walk, name: str) -> _Node:
    symbol = walk.env.get(name)
    if symbol is not None:
        return _Node({symbol: 1.0} if symbol else {}, {})  # "" is an accumulator
    return _Node({INPUT: 1.0}, {})  # facts, run: at most the input; a type name: less


def _collection(items: list[_Node], count: int) -> _Node:
    size = _sum([i.size for i in items] + [{_ONE: ELEMENT_BYTES * count}])
    return _Node(size, _sum([i.alloc for i in items] + [{_ONE: ELEMENT_BYTES * count}]))


def _call(walk: _Walk, expr_id: int, call: dict[int, list[int | bytes]], runs: float) -> _Node:
    parts = [_expr(walk, _as_bytes(a), runs) for a in call.get(1, []) + call.get(3, [])]
    alloc = _sum([p.alloc for p in parts])
    name = _text(call[2][0])
    overloads = walk.refs.get(expr_id, (name, frozenset()))[1]
    concat = name == "_+_" and (not overloads or overloads & _CONCAT_OVERLOADS)
    if concat or name in _CONVERSIONS:
        size = _sum([p.size for p in parts])
        node = _Node(size, _sum([alloc, size]))
        walk.flag(expr_id, node.alloc, runs)
        return node
    if name == "_?_:_":
        return _Node(_sum([p.size for p in parts[1:]]), alloc)
    if name in ("_[_]", "dyn"):
        return _Node(parts[0].size, alloc)  # a part of the container, the value itself
    return _Node({_ONE: ELEMENT_BYTES}, alloc)  # a boolean, a number, a size


def _comprehension(
    walk: _Walk, expr_id: int, comp: dict[int, list[int | bytes]], runs: float
) -> _Node:
    """One evaluation: the range and the initial value once, the condition and the step
    per iteration, the result once. Variables are symbols: a term in an iteration
    variable sums to the range over the iterations; any other term is paid per iteration."""
    range_raw = _as_bytes(comp[2][0])
    rng = _expr(walk, range_raw, runs)
    init = _expr(walk, _as_bytes(comp[4][0]), runs)
    length = _literal_length(range_raw)
    iterations = min(length, max(1.0, ITERATIONS / runs))  # the budget is shared
    inner_runs = runs * iterations
    names = [_text(comp[k][0]) for k in (1, 8) if comp.get(k) and comp[k][0]]
    accu = _text(comp[3][0])
    saved = dict(walk.env)
    symbols = [f"{name}#{expr_id}#{i}" for i, name in enumerate(names)]
    for name, symbol in zip(names, symbols, strict=True):
        walk.env[name] = symbol
        walk.var_total[symbol] = rng.size
    walk.env[accu] = ""  # what a step adds, not the accumulator it copies (see above)
    cond = _expr(walk, _as_bytes(comp[5][0]), inner_runs)
    step = _expr(walk, _as_bytes(comp[6][0]), inner_runs)
    walk.env = saved
    each = _Iterations(symbols, rng.size, iterations, length, walk.var_total)
    added = each.total(step.size)
    per_step = each.total(_sum([cond.alloc, step.alloc]))
    walk.env[accu] = ""
    result = _expr(walk, _as_bytes(comp[7][0]), runs)
    walk.env = saved
    size = _sum([init.size, added]) if not result.size else result.size
    node = _Node(size, _sum([rng.alloc, init.alloc, per_step, result.alloc]))
    walk.flag(expr_id, node.alloc, runs)
    return node


@dataclass
class _Iterations:
    """A form paid per iteration, summed over a comprehension's iterations. A term in its
    own variables sums to the range. A term in an enclosing comprehension's variable is
    paid at each of this one's iterations (``length``): the enclosing one sums it over its
    range. Any other term is paid at most ``shared`` times: every comprehension's
    iterations together stay within the runtime's budget."""

    symbols: list[str]
    rng: Form
    shared: float
    length: float
    var_total: dict[str, Form]

    def total(self, form: Form) -> Form:
        parts: list[Form] = [_scaled(self.rng, form[s]) for s in self.symbols if s in form]
        for k, v in form.items():
            if k in self.symbols:
                continue
            parts.append({k: v * (self.length if k in self.var_total else self.shared)})
        return _sum(parts)


def _literal_length(raw: bytes) -> float:
    """A list or map literal's length; any other range may be as long as the budget."""
    f = _fields(raw)
    if 7 in f:
        return float(len(_fields(_as_bytes(f[7][0])).get(1, [])))
    if 8 in f:
        return float(len(_fields(_as_bytes(f[8][0])).get(2, [])))
    return float(ITERATIONS)


# --- forms ---------------------------------------------------------------------------------


def _sum(forms: list[Form]) -> Form:
    out: defaultdict[str, float] = defaultdict(float)
    for form in forms:
        for k, v in form.items():
            out[k] += v
    return dict(out)


def _scaled(form: Form, by: float) -> Form:
    return {k: v * by for k, v in form.items()}


# --- the wire format -----------------------------------------------------------------------


def _fields(buf: bytes) -> dict[int, list[int | bytes]]:
    """A message's fields by number: varints as ints, length-delimited ones as bytes."""
    out: defaultdict[int, list[int | bytes]] = defaultdict(list)
    i, end = 0, len(buf)
    while i < end:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i : i + length], i + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, i = buf[i : i + width], i + width
        else:
            raise ValueError(f"wire type {wire} in a checked expression")
        out[number].append(value)
    return dict(out)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _as_bytes(value: int | bytes) -> bytes:
    assert isinstance(value, bytes)
    return value


def _text(value: int | bytes) -> str:
    return _as_bytes(value).decode()


def _id(raw: bytes) -> int:
    ids = _fields(raw).get(2, [0])
    return ids[0] if isinstance(ids[0], int) else 0


def _references(checked: dict[int, list[int | bytes]]) -> dict[int, tuple[str, frozenset[str]]]:
    """Each call's function and the overloads the checker left it (``reference_map``)."""
    out: dict[int, tuple[str, frozenset[str]]] = {}
    for entry in checked.get(2, []):
        e = _fields(_as_bytes(entry))
        key = e.get(1, [0])[0]
        ref = _fields(_as_bytes(e[2][0])) if 2 in e else {}
        name = _text(ref[1][0]) if 1 in ref else ""
        assert isinstance(key, int)
        out[key] = (name, frozenset(_text(o) for o in ref.get(3, [])))
    return out


def _positions(checked: dict[int, list[int | bytes]]) -> dict[int, int]:
    source = _fields(_as_bytes(checked[5][0])) if 5 in checked else {}
    out: dict[int, int] = {}
    for entry in source.get(4, []):
        e = _fields(_as_bytes(entry))
        key, offset = e.get(1, [0])[0], e.get(2, [0])[0]
        assert isinstance(key, int) and isinstance(offset, int)
        out[key] = offset
    return out


def _line_column(checked: dict[int, list[int | bytes]], offset: int) -> tuple[int, int]:
    source = _fields(_as_bytes(checked[5][0])) if 5 in checked else {}
    starts = [0]
    for value in source.get(3, []):  # line_offsets: packed or not
        if isinstance(value, int):
            starts.append(value)
            continue
        i = 0
        while i < len(value):
            v, i = _varint(value, i)
            starts.append(v)
    line = sum(1 for s in starts if s <= offset)
    return line, offset - starts[line - 1] + 1
