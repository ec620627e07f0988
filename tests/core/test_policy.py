"""Run policy and redaction (orchestrator_core.policy)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from orchestrator_core.errors import InvalidParams, OrchestratorError
from orchestrator_core.policy import (
    DEFAULT_MASK,
    Decision,
    DecisionLogEntry,
    PolicyDenied,
    PolicyEvaluator,
    PolicySubject,
    Redaction,
    RulePolicy,
    StreamRedactor,
    enforce,
    path_glob_to_regex,
    redact_json,
    redact_text,
)

M = DEFAULT_MASK


def rule(rule_id: str, effect: str, pattern: str | None = None, **match: str) -> dict[str, Any]:
    out: dict[str, Any] = {"id": rule_id, "effect": effect, "match": match}
    if pattern is not None:
        out["pattern"] = pattern
    return out


def _field_of(exc: InvalidParams) -> str:
    assert exc.code == "INVALID_PARAMS"
    [error] = exc.details["errors"]
    assert error["field"] == exc.field
    return exc.field


LLM = PolicySubject(step_type="llm_call", model="gpt-4o", pool="eu-a100")


# --- matching ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("match", "subject", "expected"),
    [
        ({}, PolicySubject("llm_call"), True),
        ({"step_type": "llm_call"}, PolicySubject("llm_call"), True),
        ({"step_type": "llm_call"}, PolicySubject("tool_call"), False),
        ({"step_type": "llm_*"}, PolicySubject("llm_plan"), True),
        ({"step_type": "llm_*"}, PolicySubject("tool_call"), False),
        ({"step_type": "LLM_CALL"}, PolicySubject("llm_call"), False),
        ({"step_type": "llm_cal?"}, PolicySubject("llm_call"), True),
        ({"tool": "search"}, PolicySubject("tool_call", tool="search"), True),
        ({"tool": "search"}, PolicySubject("tool_call", tool="search_web"), False),
        ({"tool": "search*"}, PolicySubject("tool_call", tool="search_web"), True),
        ({"tool": "[sx]earch"}, PolicySubject("tool_call", tool="xearch"), True),
        ({"tool": "search"}, PolicySubject("tool_call"), False),
        ({"model": "gpt-*"}, PolicySubject("llm_call", model="gpt-4o"), True),
        ({"model": "gpt-*"}, PolicySubject("llm_call", model="claude-3"), False),
        ({"model": "gpt-4o"}, PolicySubject("llm_call", model="gpt-4o-mini"), False),
        ({"model": "*"}, PolicySubject("llm_call"), False),
        ({"pool": "eu-*"}, PolicySubject("llm_call", pool="eu-a100"), True),
        ({"pool": "eu-*"}, PolicySubject("llm_call", pool="us-a100"), False),
        ({"pool": "eu-a100"}, PolicySubject("llm_call", pool="eu-a100"), True),
        ({"path": "data/x.txt"}, PolicySubject("fs_op", path="data/x.txt"), True),
        ({"path": "data/x.txt"}, PolicySubject("fs_op", path="data/x.txt.bak"), False),
        ({"path": "*"}, PolicySubject("fs_op"), False),
        (
            {"step_type": "llm_call", "model": "gpt-*", "pool": "eu-*"},
            PolicySubject("llm_call", model="gpt-4o", pool="eu-a100"),
            True,
        ),
        (
            {"step_type": "llm_call", "model": "gpt-*", "pool": "eu-*"},
            PolicySubject("llm_call", model="gpt-4o", pool="us-a100"),
            False,
        ),
        ({"model": "gpt-*", "tool": "x"}, PolicySubject("llm_call", model="gpt-4o"), False),
    ],
)
def test_rule_matching(match: dict[str, str], subject: PolicySubject, expected: bool) -> None:
    policy = RulePolicy([{"id": "r", "effect": "deny", "match": match}])
    decision = policy.evaluate(subject)
    assert decision.allowed is (not expected)
    assert decision.rule_id == ("r" if expected else None)
    assert decision.log == (DecisionLogEntry(rule_id="r", effect="deny", matched=expected),)


@pytest.mark.parametrize(
    ("glob", "path", "expected"),
    [
        ("*.txt", "a.txt", True),
        ("*.txt", "dir/a.txt", False),
        ("**.txt", "dir/a.txt", True),
        ("**", "a/b/c", True),
        ("**", "", True),
        ("data/*", "data/x", True),
        ("data/*", "data/x/y", False),
        ("data/**", "data/x/y", True),
        ("data/**", "data/", True),
        ("data/**", "other/x", False),
        ("src/**/*.py", "src/a/b/c.py", True),
        ("src/**/*.py", "src/c.py", True),
        ("src/**/*.py", "src/c.pyc", False),
        ("src/**/*.py", "lib/src/c.py", False),
        ("**/secrets/*", "a/b/secrets/key", True),
        ("**/secrets/*", "secrets/key", True),
        ("**/secrets/*", "secrets/sub/key", False),
        ("file?.log", "file1.log", True),
        ("file?.log", "file12.log", False),
        ("a?b", "a/b", False),
        ("a.b", "axb", False),
        ("a+b(c)", "a+b(c)", True),
        ("[ab]", "a", False),
        ("[ab]", "[ab]", True),
    ],
)
def test_path_glob(glob: str, path: str, expected: bool) -> None:
    assert (path_glob_to_regex(glob).fullmatch(path) is not None) is expected
    policy = RulePolicy([rule("p", "deny", path=glob)])
    assert policy.evaluate(PolicySubject("fs_op", path=path)).allowed is (not expected)


# --- deciding ----------------------------------------------------------------------------------


def test_no_rules_allows_by_default() -> None:
    policy = RulePolicy([])
    assert policy.evaluate(LLM) == Decision(allowed=True, rule_id=None, redactions=(), log=())


def test_no_matching_rule_allows_with_no_rule_id() -> None:
    policy = RulePolicy([rule("d", "deny", tool="shell"), rule("a", "allow", model="claude-*")])
    decision = policy.evaluate(LLM)
    assert decision.allowed is True
    assert decision.rule_id is None
    assert [(e.rule_id, e.matched) for e in decision.log] == [("d", False), ("a", False)]


@pytest.mark.parametrize(
    ("rules", "allowed", "rule_id"),
    [
        ([rule("a", "allow"), rule("d", "deny")], True, "a"),
        ([rule("d", "deny"), rule("a", "allow")], False, "d"),
        ([rule("d1", "deny", model="gpt-*"), rule("d2", "deny")], False, "d1"),
        ([rule("d1", "deny", model="claude-*"), rule("d2", "deny")], False, "d2"),
        ([rule("a", "allow", model="gpt-4o"), rule("d", "deny", step_type="llm_*")], True, "a"),
        ([rule("a", "allow", model="other"), rule("d", "deny", step_type="llm_*")], False, "d"),
        ([rule("a1", "allow", pool="eu-*"), rule("a2", "allow")], True, "a1"),
        ([rule("r", "redact", "x"), rule("d", "deny")], False, "d"),
    ],
)
def test_first_matching_allow_or_deny_decides(
    rules: list[dict[str, Any]], allowed: bool, rule_id: str
) -> None:
    decision = RulePolicy(rules).evaluate(LLM)
    assert decision.allowed is allowed
    assert decision.rule_id == rule_id


def test_redactions_accumulate_from_every_matching_redact_rule() -> None:
    policy = RulePolicy(
        [
            rule("r1", "redact", r"sk-\w+"),
            rule("r2", "redact", r"\d{4}", model="claude-*"),
            rule("allow", "allow", step_type="llm_call"),
            rule("r3", "redact", r"[a-z]+@[a-z]+\.com", pool="eu-*"),
            rule("deny", "deny"),
            rule("r4", "redact", r"secret"),
        ]
    )
    decision = policy.evaluate(LLM)
    assert decision.allowed is True
    assert decision.rule_id == "allow"
    assert [r.rule_id for r in decision.redactions] == ["r1", "r3", "r4"]
    assert all(isinstance(r, Redaction) for r in decision.redactions)
    assert [p.pattern for p in decision.patterns] == [r"sk-\w+", r"[a-z]+@[a-z]+\.com", "secret"]
    assert decision.log == (
        DecisionLogEntry("r1", "redact", True),
        DecisionLogEntry("r2", "redact", False),
        DecisionLogEntry("allow", "allow", True),
        DecisionLogEntry("r3", "redact", True),
        DecisionLogEntry("deny", "deny", True),
        DecisionLogEntry("r4", "redact", True),
    )
    text = "key sk-abc mail bob@site.com 1234 top secret"
    assert redact_text(text, decision.patterns) == f"key {M} mail {M} 1234 top {M}"


def test_denied_decision_carries_no_redactions() -> None:
    policy = RulePolicy([rule("r", "redact", "x"), rule("no-gpt", "deny", model="gpt-*")])
    decision = policy.evaluate(LLM)
    assert decision.allowed is False
    assert decision.rule_id == "no-gpt"
    assert decision.redactions == ()
    assert decision.log == (
        DecisionLogEntry("r", "redact", True),
        DecisionLogEntry("no-gpt", "deny", True),
    )


def test_redact_rules_alone_allow() -> None:
    decision = RulePolicy([rule("r", "redact", "x")]).evaluate(LLM)
    assert (decision.allowed, decision.rule_id) == (True, None)
    assert [r.rule_id for r in decision.redactions] == ["r"]


def test_enforce_raises_policy_denied() -> None:
    policy = RulePolicy([rule("no-shell", "deny", tool="shell")])
    subject = PolicySubject("tool_call", tool="shell")
    with pytest.raises(PolicyDenied) as info:
        enforce(policy, subject)
    exc = info.value
    assert isinstance(exc, OrchestratorError)
    assert exc.code == "POLICY_DENIED"
    assert exc.rule_id == "no-shell"
    assert "no-shell" in exc.message
    assert exc.details == {
        "rule_id": "no-shell",
        "subject": {
            "step_type": "tool_call",
            "tool": "shell",
            "model": None,
            "pool": None,
            "path": None,
        },
    }
    assert exc.body()["code"] == "POLICY_DENIED"
    allowed = enforce(policy, PolicySubject("tool_call", tool="search"))
    assert allowed.allowed is True


@pytest.mark.parametrize(
    ("subject", "expected"),
    [(None, {}), ({"step_type": "x"}, {"step_type": "x"})],
)
def test_policy_denied_subject_forms(subject: Any, expected: dict[str, Any]) -> None:
    exc = PolicyDenied("r1", subject)
    assert exc.details == {"rule_id": "r1", "subject": expected}
    assert exc.message == "denied by policy rule 'r1'"


def test_rule_policy_is_a_policy_evaluator() -> None:
    policy: PolicyEvaluator = RulePolicy([])
    assert isinstance(policy, PolicyEvaluator)


def test_from_policy() -> None:
    rules = [rule("a", "allow", tool="x")]
    assert RulePolicy.from_policy({"rules": rules}).policy_hash == RulePolicy(rules).policy_hash
    assert RulePolicy.from_policy(None).policy_hash == RulePolicy([]).policy_hash
    assert RulePolicy.from_policy({}).policy_hash == RulePolicy([]).policy_hash
    assert RulePolicy.from_policy({"rules": rules}).rule_ids == ("a",)


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "field"),
    [
        ("nope", "policy.rules"),
        ({"id": "a"}, "policy.rules"),
        (["nope"], "policy.rules[0]"),
        ([rule("a", "allow"), rule("a", "deny")], "policy.rules[1].id"),
        ([rule("a", "allow"), rule("b", "deny"), rule("b", "allow")], "policy.rules[2].id"),
        ([{"effect": "allow"}], "policy.rules[0].id"),
        ([{"id": "", "effect": "allow"}], "policy.rules[0].id"),
        ([{"id": 3, "effect": "allow"}], "policy.rules[0].id"),
        ([{"id": "a"}], "policy.rules[0].effect"),
        ([{"id": "a", "effect": "block"}], "policy.rules[0].effect"),
        ([{"id": "a", "effect": "allow", "extra": 1}], "policy.rules[0].extra"),
        ([{"id": "a", "effect": "allow", "match": "x"}], "policy.rules[0].match"),
        ([{"id": "a", "effect": "allow", "match": {"user": "x"}}], "policy.rules[0].match.user"),
        ([{"id": "a", "effect": "allow", "match": {"tool": 1}}], "policy.rules[0].match.tool"),
        ([rule("a", "allow"), rule("r", "redact")], "policy.rules[1].pattern"),
        (
            [rule("a", "allow"), rule("b", "allow"), rule("r", "redact", "(")],
            "policy.rules[2].pattern",
        ),
        ([rule("r", "redact", "[a-")], "policy.rules[0].pattern"),
        ([rule("r", "redact", "a*")], "policy.rules[0].pattern"),
        ([rule("r", "redact", "")], "policy.rules[0].pattern"),
        ([rule("r", "redact", "x?")], "policy.rules[0].pattern"),
        ([rule("r", "redact", "^")], "policy.rules[0].pattern"),
        ([rule("r", "redact", "$")], "policy.rules[0].pattern"),
        ([rule("r", "redact", "a|")], "policy.rules[0].pattern"),
        ([{"id": "r", "effect": "redact", "pattern": 5}], "policy.rules[0].pattern"),
        ([rule("a", "allow", "x")], "policy.rules[0].pattern"),
        ([rule("ok", "redact", "x"), rule("d", "deny", "x")], "policy.rules[1].pattern"),
    ],
)
def test_validation_names_the_field(rules: Any, field: str) -> None:
    with pytest.raises(InvalidParams) as info:
        RulePolicy(rules)
    assert _field_of(info.value) == field
    with pytest.raises(InvalidParams) as again:
        RulePolicy.validate(rules)
    assert _field_of(again.value) == field


def test_validation_field_prefix_is_configurable() -> None:
    with pytest.raises(InvalidParams) as info:
        RulePolicy.from_policy({"rules": [rule("r", "redact")]}, field="runs[0].policy")
    assert _field_of(info.value) == "runs[0].policy.rules[0].pattern"
    with pytest.raises(InvalidParams) as extra:
        RulePolicy.from_policy({"rules": [], "other": 1})
    assert _field_of(extra.value) == "policy.other"
    with pytest.raises(InvalidParams) as shape:
        RulePolicy.from_policy(["x"])  # type: ignore[arg-type]
    assert _field_of(shape.value) == "policy"


@pytest.mark.parametrize(
    "rules",
    [
        [],
        [{"id": "a", "effect": "allow"}],
        [{"id": "a", "effect": "allow", "match": None, "pattern": None}],
        [rule("r", "redact", r"\bsk-[A-Za-z0-9]{20,}\b", model="gpt-*", path="**/*.env")],
        [rule("r", "redact", r"\b")],
    ],
)
def test_valid_rules_are_accepted(rules: list[dict[str, Any]]) -> None:
    RulePolicy.validate(rules)
    assert len(RulePolicy(rules).rule_ids) == len(rules)


# --- policy_hash -------------------------------------------------------------------------------


def test_policy_hash_is_stable() -> None:
    rules = [rule("a", "allow", model="gpt-*"), rule("r", "redact", r"\d+")]
    h = RulePolicy(rules).policy_hash
    assert h.startswith("sha256:")
    assert len(h) == len("sha256:") + 64
    assert RulePolicy([dict(reversed(list(r.items()))) for r in rules]).policy_hash == h
    spelled_out: list[dict[str, Any]] = [
        {"id": "a", "effect": "allow", "match": {"model": "gpt-*", "tool": None}, "pattern": None},
        {"id": "r", "effect": "redact", "pattern": r"\d+", "match": {}},
    ]
    assert RulePolicy(spelled_out).policy_hash == h
    assert RulePolicy([]).policy_hash == RulePolicy(None).policy_hash


def test_policy_hash_is_order_sensitive() -> None:
    a, d = rule("a", "allow"), rule("d", "deny")
    assert RulePolicy([a, d]).policy_hash != RulePolicy([d, a]).policy_hash


@pytest.mark.parametrize(
    "changed",
    [
        [rule("a2", "allow", model="gpt-*")],
        [rule("a", "deny", model="gpt-*")],
        [rule("a", "allow", model="gpt-4*")],
        [rule("a", "allow", pool="gpt-*")],
        [rule("a", "allow")],
    ],
)
def test_policy_hash_changes_with_any_rule_field(changed: list[dict[str, Any]]) -> None:
    assert (
        RulePolicy(changed).policy_hash
        != RulePolicy([rule("a", "allow", model="gpt-*")]).policy_hash
    )


def test_policy_hash_covers_the_pattern() -> None:
    one = RulePolicy([rule("r", "redact", "x")]).policy_hash
    assert one != RulePolicy([rule("r", "redact", "y")]).policy_hash


# --- redact_text / redact_json -----------------------------------------------------------------

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
KEY = re.compile(r"sk-[A-Za-z0-9]{16,24}")


@pytest.mark.parametrize(
    ("text", "patterns", "expected"),
    [
        ("nothing here", [EMAIL, KEY], "nothing here"),
        ("mail a@b.io now", [EMAIL], f"mail {M} now"),
        ("a@b.io,c@d.io", [EMAIL], f"{M},{M}"),
        ("sk-ABCDEFGHIJKLMNOP and x@y.org", [EMAIL, KEY], f"{M} and {M}"),
        ("sk-ABCDEFGHIJKLMNOP and x@y.org", [KEY], f"{M} and x@y.org"),
        ("", [EMAIL], ""),
        ("no patterns a@b.io", [], "no patterns a@b.io"),
        # overlapping matches from two patterns merge into one mask
        ("xTOKEN_ABCD1234_ENDx", [re.compile(r"TOKEN_\w{8}"), re.compile(r"\w{8}_END")], f"x{M}x"),
        # touching matches merge too
        ("-AAAABBBB-", [re.compile("A{4}"), re.compile("B{4}")], f"-{M}-"),
        # a mask is never matched again by a later pattern
        ("secret", [re.compile("secret"), re.compile(r"REDACTED")], M),
        # lookbehind sees the original text
        ("password=hunter2 ok", [re.compile(r"(?<=password=)\S+")], f"password={M} ok"),
        # zero-width matches are ignored
        ("a b", [re.compile(r"\b")], "a b"),
        ("aaa", [re.compile("aa")], f"{M}a"),
    ],
)
def test_redact_text(text: str, patterns: list[re.Pattern[str]], expected: str) -> None:
    assert redact_text(text, patterns) == expected


def test_redact_text_custom_mask() -> None:
    assert redact_text("a@b.io", [EMAIL], mask="***") == "***"


def test_redact_json_redacts_string_values_not_keys() -> None:
    value: dict[str, Any] = {
        "a@b.io": "to a@b.io",
        "n": 5,
        "f": 1.5,
        "ok": True,
        "none": None,
        "list": ["x@y.org", {"deep": ["sk-ABCDEFGHIJKLMNOPQ"]}, 3],
        "tuple": ("c@d.io",),
    }
    assert redact_json(value, [EMAIL, KEY]) == {
        "a@b.io": f"to {M}",
        "n": 5,
        "f": 1.5,
        "ok": True,
        "none": None,
        "list": [M, {"deep": [M]}, 3],
        "tuple": (M,),
    }
    assert value["list"][0] == "x@y.org"  # the input is not mutated


@pytest.mark.parametrize("value", ["a@b.io", 3, None, [1, "a@b.io"], {"k": "a@b.io"}])
def test_redact_json_without_patterns_is_identity(value: Any) -> None:
    assert redact_json(value, []) == value


@pytest.mark.parametrize(("value", "expected"), [("a@b.io", M), ([["a@b.io"]], [[M]]), (7, 7)])
def test_redact_json_scalars_and_nesting(value: Any, expected: Any) -> None:
    assert redact_json(value, [EMAIL], mask=M) == expected


# --- StreamRedactor ----------------------------------------------------------------------------

STREAM_PATTERNS = [
    EMAIL,
    KEY,
    re.compile(r"\b\d{3}-\d{2}-\d{4}\b"),
    re.compile(r"TOKEN_\w{8}"),
    re.compile(r"\w{8}_END"),
    re.compile("A{4}"),
    re.compile("B{4}"),
    re.compile(r"(?<=password=)\S+"),
]

STREAM_TEXT = (
    "Hello alice@example.com, your key is sk-AbCdEfGhIjKlMnOpQr12 and the backup "
    "sk-ZZZZZZZZZZZZZZZZZZZZ. SSN 123-45-6789 (not 1234-45-6789). "
    "Write to bob.smith+tag@mail.example.org or carol@x.io;dave@y.co. "
    "xTOKEN_ABCD1234_ENDx and -AAAABBBB- and AAAAAAAAA. password=hunter2 done. "
    "Trailing key sk-0123456789abcdef"
)


def _random_tokens(text: str, rng: random.Random, max_len: int) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(text):
        n = rng.randint(0, max_len)  # zero-length tokens happen too
        tokens.append(text[i : i + n])
        i += n
    if rng.random() < 0.5:
        tokens.append("")
    return tokens


def _run_stream(redactor: StreamRedactor, tokens: list[str]) -> list[str]:
    out: list[str] = []
    for token in tokens:
        out.extend(redactor.push(token))
    out.extend(redactor.flush())
    return out


@pytest.mark.parametrize("window", [32, 40, 64, 200])
@pytest.mark.parametrize("max_len", [1, 3, 8, 20, 50])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 7, 42, 1234, 99999])
def test_stream_matches_redact_text_for_any_tokenization(
    window: int, max_len: int, seed: int
) -> None:
    rng = random.Random(seed * 1000 + max_len)
    tokens = _random_tokens(STREAM_TEXT, rng, max_len)
    assert "".join(tokens) == STREAM_TEXT
    redactor = StreamRedactor(STREAM_PATTERNS, window_chars=window)
    out = _run_stream(redactor, tokens)
    assert len(out) == len(tokens)
    assert "".join(out) == redact_text(STREAM_TEXT, STREAM_PATTERNS)


def _longest_match(text: str, patterns: list[re.Pattern[str]]) -> int:
    return max((m.end() - m.start() for p in patterns for m in p.finditer(text)), default=0)


@pytest.mark.parametrize("seed", range(25))
def test_stream_matches_redact_text_on_random_text(seed: int) -> None:
    """Random secrets and separators; the window is just above what the patterns look at.

    The longest match plus one, but at least 13: ``(?<=password=)`` looks 9 characters back and
    ``\\b\\d{3}-\\d{2}-\\d{4}\\b`` looks at 12 characters to decide a match.
    """
    rng = random.Random(seed)
    pieces = ["alice@example.com", "sk-" + "Q" * 18, "123-45-6789", "AAAA", "BBBB", "x", "."]
    separators = [" ", "", ", ", "\n", "-", "=", "password="]
    text = "".join(rng.choice(pieces) + rng.choice(separators) for _ in range(60))
    window = max(_longest_match(text, STREAM_PATTERNS) + 1, 13)
    tokens = _random_tokens(text, rng, rng.choice([1, 4, 10, 30]))
    out = _run_stream(StreamRedactor(STREAM_PATTERNS, window_chars=window), tokens)
    assert len(out) == len(tokens)
    assert "".join(out) == redact_text(text, STREAM_PATTERNS)


def test_stream_outputs_align_with_input_tokens() -> None:
    redactor = StreamRedactor([EMAIL], window_chars=8)
    tokens = ["mail ", "bob", "@", "site", ".com", " now", " and", " then", " more"]
    out = _run_stream(redactor, tokens)
    assert out == ["mail ", M, "", "", "", " now", " and", " then", " more"]


def test_stream_holds_tokens_within_the_window() -> None:
    redactor = StreamRedactor([EMAIL], window_chars=4)
    assert redactor.push("0123") == []
    assert redactor.held == 1
    # 8 chars seen: "0123" ends at 4 <= 8 - 4, so it is out of the window and released
    assert redactor.push("4567") == ["0123"]
    assert redactor.push("89") == []
    assert redactor.held == 2
    assert redactor.push("ab") == ["4567"]
    assert redactor.push("cdefghij") == ["89", "ab"]
    assert redactor.flush() == ["cdefghij"]
    assert redactor.held == 0


def test_stream_long_token_is_held_until_the_window_passes_it() -> None:
    redactor = StreamRedactor([EMAIL], window_chars=4)
    assert redactor.push("x" * 50) == []
    assert redactor.push("yyyy") == ["x" * 50]
    assert redactor.flush() == ["yyyy"]


def test_stream_mask_goes_to_the_first_token_the_match_touches() -> None:
    redactor = StreamRedactor([KEY], window_chars=64)
    tokens = ["key=", "sk-ABCD", "EFGHIJKL", "MNOPQR", "; ok"]
    out = _run_stream(redactor, tokens)
    assert out == ["key=", M, "", "", "; ok"]


def test_stream_match_inside_one_token() -> None:
    out = _run_stream(StreamRedactor([EMAIL]), ["a ", "x a@b.io y", " z"])
    assert out == ["a ", f"x {M} y", " z"]


def test_stream_without_patterns_passes_through() -> None:
    redactor = StreamRedactor([])
    assert redactor.push("a@b.io") == ["a@b.io"]
    assert redactor.push("") == [""]
    assert redactor.held == 0
    assert redactor.flush() == []


def test_stream_flush_resets_for_another_stream() -> None:
    redactor = StreamRedactor([EMAIL], window_chars=16)
    assert _run_stream(redactor, ["a@b", ".io"]) == [M, ""]
    assert _run_stream(redactor, ["c@d.io", " x"]) == [M, " x"]
    assert redactor.flush() == []


def test_stream_custom_mask() -> None:
    assert _run_stream(StreamRedactor([EMAIL], mask="#"), ["a@", "b.io"]) == ["#", ""]


@pytest.mark.parametrize("window", [0, -1])
def test_stream_window_must_be_positive(window: int) -> None:
    with pytest.raises(ValueError, match="window_chars"):
        StreamRedactor([EMAIL], window_chars=window)


def test_stream_match_longer_than_the_window_may_escape() -> None:
    """The documented limitation: a secret longer than the window is only partly masked."""
    pattern = re.compile(r"sk-[A-Za-z0-9]{20,}")
    key = "sk-" + "".join(chr(ord("a") + i % 26) for i in range(100))
    text = f"key {key} end"
    tokens = [text[i : i + 4] for i in range(0, len(text), 4)]
    assert redact_text(text, [pattern]) == f"key {M} end"
    out = _run_stream(StreamRedactor([pattern], window_chars=32), tokens)
    assert len(out) == len(tokens)
    # "sk-a" is released once 40 characters are seen; the match is cut there and the rest of
    # the key escapes
    assert "".join(out) == f"key {M}" + text[40:]
    assert key[-10:] in "".join(out)
    # a window the match fits in redacts it whole
    out = _run_stream(StreamRedactor([pattern], window_chars=len(key) + 1), tokens)
    assert "".join(out) == f"key {M} end"


def test_stream_match_shorter_than_the_window_needs_enough_to_match() -> None:
    """With a window below the minimal match length, the secret can escape entirely."""
    pattern = re.compile(r"sk-[A-Za-z0-9]{20,}")
    text = "key sk-" + "a" * 30 + " end"
    tokens = [text[i : i + 4] for i in range(0, len(text), 4)]
    out = _run_stream(StreamRedactor([pattern], window_chars=16), tokens)
    assert "".join(out) == text
