"""Run policy: allow / deny / redact rules, and the redaction of stored and streamed text.

A run carries the contract's policy, ``{"rules": [{"id", "effect", "match", "pattern"?}]}``.
Before a step executes, the orchestrator describes it as a :class:`PolicySubject` and asks a
:class:`PolicyEvaluator` for a :class:`Decision`: whether the step may run, which rule said
so, and which redaction patterns apply to what the step stores and streams.

:class:`PolicyEvaluator` is a Protocol on purpose. :class:`RulePolicy` below is the built-in
engine for the contract's rule list; an OPA/Rego or CEL engine can plug in later by
implementing the same two members (``evaluate`` and ``policy_hash``) without the callers
changing.

Redaction works on text (:func:`redact_text`), on JSON values (:func:`redact_json`) and on a
stream of token texts (:class:`StreamRedactor`), and all three agree: every non-empty match of
every pattern is found in the original text, overlapping or touching matches merge into one
span, and each span is replaced by a single mask.

Every pattern and glob of a policy runs on RE2 (``orchestrator_core.regexes``,
``orchestrator_core.globs``), in time linear in the text it is matched against: a redact
``pattern`` RE2 cannot run (backreferences, lookaround) is refused at run creation, naming
``policy.rules[i].pattern``. The redaction helpers also take Python ``re`` patterns (tests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import InvalidParams, OrchestratorError
from orchestrator_core.globs import name_glob, path_glob
from orchestrator_core.regexes import Pattern, Regex, compile_regex

__all__ = [
    "DEFAULT_MASK",
    "MATCH_FIELDS",
    "Decision",
    "DecisionLogEntry",
    "PolicyDenied",
    "PolicyEvaluator",
    "PolicySubject",
    "Redaction",
    "RulePolicy",
    "StreamRedactor",
    "enforce",
    "path_glob_to_regex",
    "redact_json",
    "redact_text",
]

DEFAULT_MASK = "[REDACTED]"
MATCH_FIELDS: tuple[str, ...] = ("step_type", "tool", "model", "pool", "path")
_EFFECTS = ("allow", "deny", "redact")
_RULE_KEYS = frozenset({"id", "effect", "match", "pattern"})
# A redact pattern runs over every token's window (``StreamRedactor``, 64 characters): at
# RE2's worst (``schemas.bounds.NS_PER_REGEX_UNIT``) 1,000 instructions cost a token under
# 4 ms. Secrets' patterns are far smaller (``sk-[A-Za-z0-9]{20,}`` is about 30).
MAX_REDACT_PROGRAM = 1000

Effect = Literal["allow", "deny", "redact"]


# --- subjects, decisions, the error ------------------------------------------------------------


@dataclass(frozen=True)
class PolicySubject:
    """What a step is about to do, as the rules see it. ``None`` means "not applicable"."""

    step_type: str
    tool: str | None = None
    model: str | None = None
    pool: str | None = None
    path: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


@dataclass(frozen=True)
class Redaction:
    rule_id: str
    pattern: Regex


@dataclass(frozen=True)
class DecisionLogEntry:
    rule_id: str
    effect: str
    matched: bool


@dataclass(frozen=True)
class Decision:
    """The answer for one subject.

    ``rule_id`` names the allow/deny rule that decided, or is ``None`` when no allow/deny rule
    matched (the default is to allow). ``redactions`` is empty when the subject is denied.
    ``log`` has one entry per rule, in rule order.
    """

    allowed: bool
    rule_id: str | None
    redactions: tuple[Redaction, ...]
    log: tuple[DecisionLogEntry, ...]

    @property
    def patterns(self) -> tuple[Regex, ...]:
        """The redaction patterns, in rule order, ready for the redaction helpers."""
        return tuple(r.pattern for r in self.redactions)


class PolicyDenied(OrchestratorError):
    """A deny rule matched. The transport answers 403 ``POLICY_DENIED``."""

    code = "POLICY_DENIED"

    def __init__(
        self, rule_id: str, subject: PolicySubject | Mapping[str, Any] | None = None
    ) -> None:
        if isinstance(subject, PolicySubject):
            subject_dict: dict[str, Any] = subject.as_dict()
        else:
            subject_dict = dict(subject or {})
        super().__init__(
            f"denied by policy rule {rule_id!r}",
            details={"rule_id": rule_id, "subject": subject_dict},
        )
        self.rule_id = rule_id


@runtime_checkable
class PolicyEvaluator(Protocol):
    """A policy engine. :class:`RulePolicy` is one; an OPA/Rego or CEL engine can be another."""

    @property
    def policy_hash(self) -> str:
        """A stable ``"sha256:<hex>"`` identity of the policy, recorded with the run."""
        ...

    def evaluate(self, subject: PolicySubject) -> Decision: ...


def enforce(evaluator: PolicyEvaluator, subject: PolicySubject) -> Decision:
    """Evaluate ``subject``: raise :class:`PolicyDenied` when denied, else return the decision."""
    decision = evaluator.evaluate(subject)
    if not decision.allowed:
        raise PolicyDenied(decision.rule_id or "", subject)
    return decision


# --- matching ----------------------------------------------------------------------------------


def path_glob_to_regex(glob: str, *, field: str = "glob") -> Regex:
    """Compile a path glob (:func:`orchestrator_core.globs.path_glob`, on RE2): ``**``
    crosses directories, ``*`` and ``?`` stay within one; ``**/`` also matches zero
    directories (``src/**/x.py`` matches ``src/x.py``). Every other character is literal (no
    character classes). The whole path must match (``fullmatch``)."""
    return path_glob(glob, field=field)


@dataclass(frozen=True)
class _Rule:
    id: str
    effect: Effect
    globs: tuple[tuple[str, Regex], ...]  # (match field, its glob compiled)
    pattern: Regex | None

    def matches(self, subject: PolicySubject) -> bool:
        for name, glob in self.globs:
            value: str | None = getattr(subject, name)
            if value is None or glob.fullmatch(value) is None:
                return False
        return True


class RulePolicy:
    """The contract's rule-list policy.

    Matching: a rule matches a subject when every field given in its ``match`` matches the
    subject's field (an empty ``match`` matches everything). ``step_type``, ``tool``, ``model``
    and ``pool`` are shell-style globs (read as :func:`fnmatch.fnmatchcase` reads them, on RE2:
    ``orchestrator_core.globs.name_glob``; case-sensitive: ``gpt-*`` matches ``gpt-4o``; a
    string without wildcards matches exactly). ``path`` is a path glob
    (:func:`path_glob_to_regex`: ``**`` crosses directories, ``*`` and ``?`` do not). A field
    given in ``match`` whose subject value is ``None`` does not match.

    Deciding: rules are read in order and every rule is evaluated. The first matching
    ``allow`` or ``deny`` rule decides: ``allow`` allows (later denies are ignored), ``deny``
    denies. When no allow/deny rule matches, the subject is allowed with ``rule_id=None``.
    Every matching ``redact`` rule, wherever it sits, contributes its compiled ``pattern``,
    unless the subject is denied (then there are no redactions). The decision's log lists
    every rule with whether it matched.

    Validation (at construction, as :class:`InvalidParams` naming the field, such as
    ``policy.rules[2].pattern``): the rule shape and types, duplicate ids, a redact rule without
    a pattern, a regex RE2 cannot run or larger than ``MAX_REDACT_PROGRAM``, a pattern that
    matches the empty string, and an allow/deny rule that carries a pattern.

    ``policy_hash`` is :func:`sha256_of` the normalized rules (match fields that are not given
    left out, ``pattern`` only on redact rules), so it is stable across key order and spelling
    of absent fields, and changes with rule order.
    """

    def __init__(self, rules: Sequence[Mapping[str, Any]] | None = None, *, field: str = "policy"):
        self._field = field
        self._rules, normalized = self._validate(rules if rules is not None else [], field)
        self._hash = sha256_of({"rules": normalized})

    @classmethod
    def from_policy(cls, policy: Mapping[str, Any] | None, *, field: str = "policy") -> RulePolicy:
        """Build from the contract's whole policy object, ``{"rules": [...]}`` (or ``None``)."""
        if policy is None:
            return cls([], field=field)
        if not isinstance(policy, Mapping):
            raise InvalidParams('must be an object {"rules": [...]}', field=field)
        extra = sorted(set(policy) - {"rules"})
        if extra:
            raise InvalidParams("unknown field", field=f"{field}.{extra[0]}")
        return cls(policy.get("rules") or [], field=field)

    @staticmethod
    def validate(rules: Any, field: str = "policy") -> None:
        """Raise :class:`InvalidParams` if ``rules`` is not a valid rule list."""
        RulePolicy._validate(rules, field)

    @staticmethod
    def _validate(rules: Any, field: str) -> tuple[tuple[_Rule, ...], list[dict[str, Any]]]:
        base = f"{field}.rules"
        if not isinstance(rules, Sequence) or isinstance(rules, (str, bytes)):
            raise InvalidParams("must be a list of rules", field=base)
        compiled: list[_Rule] = []
        normalized: list[dict[str, Any]] = []
        seen: set[str] = set()
        for i, raw in enumerate(rules):
            at = f"{base}[{i}]"
            if not isinstance(raw, Mapping):
                raise InvalidParams("must be an object", field=at)
            for key in raw:
                if key not in _RULE_KEYS:
                    raise InvalidParams("unknown field", field=f"{at}.{key}")
            rule_id = raw.get("id")
            if not isinstance(rule_id, str) or not rule_id:
                raise InvalidParams("must be a non-empty string", field=f"{at}.id")
            if rule_id in seen:
                raise InvalidParams(f"duplicate rule id {rule_id!r}", field=f"{at}.id")
            seen.add(rule_id)
            effect = raw.get("effect")
            if effect not in _EFFECTS:
                raise InvalidParams('must be "allow", "deny" or "redact"', field=f"{at}.effect")
            match = _validate_match(raw.get("match"), f"{at}.match")
            pattern = _validate_pattern(effect, raw.get("pattern"), f"{at}.pattern")
            compiled.append(
                _Rule(id=rule_id, effect=effect, globs=_globs(match, at), pattern=pattern)
            )
            norm: dict[str, Any] = {"id": rule_id, "effect": effect, "match": dict(match)}
            if pattern is not None:
                norm["pattern"] = pattern.pattern
            normalized.append(norm)
        return tuple(compiled), normalized

    @property
    def policy_hash(self) -> str:
        return self._hash

    @property
    def rule_ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self._rules)

    def evaluate(self, subject: PolicySubject) -> Decision:
        decided: _Rule | None = None
        redactions: list[Redaction] = []
        log: list[DecisionLogEntry] = []
        for rule in self._rules:
            matched = rule.matches(subject)
            log.append(DecisionLogEntry(rule_id=rule.id, effect=rule.effect, matched=matched))
            if not matched:
                continue
            if rule.effect == "redact":
                assert rule.pattern is not None
                redactions.append(Redaction(rule_id=rule.id, pattern=rule.pattern))
            elif decided is None:
                decided = rule
        allowed = decided is None or decided.effect == "allow"
        return Decision(
            allowed=allowed,
            rule_id=decided.id if decided is not None else None,
            redactions=tuple(redactions) if allowed else (),
            log=tuple(log),
        )

    def __repr__(self) -> str:
        return f"RulePolicy(rules={len(self._rules)}, policy_hash={self._hash!r})"


def _validate_match(raw: Any, at: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InvalidParams("must be an object", field=at)
    for key in raw:
        if key not in MATCH_FIELDS:
            raise InvalidParams(
                f"unknown match field (known: {', '.join(MATCH_FIELDS)})", field=f"{at}.{key}"
            )
    out: list[tuple[str, str]] = []
    for name in MATCH_FIELDS:
        value = raw.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidParams("must be a string", field=f"{at}.{name}")
        out.append((name, value))
    return tuple(out)


def _globs(match: tuple[tuple[str, str], ...], at: str) -> tuple[tuple[str, Regex], ...]:
    return tuple(
        (name, (path_glob if name == "path" else name_glob)(glob, field=f"{at}.match.{name}"))
        for name, glob in match
    )


def _validate_pattern(effect: str, raw: Any, at: str) -> Regex | None:
    if effect != "redact":
        if raw is not None:
            raise InvalidParams(f"only redact rules take a pattern, not {effect}", field=at)
        return None
    if raw is None:
        raise InvalidParams("a redact rule needs a pattern", field=at)
    if not isinstance(raw, str):
        raise InvalidParams("must be a string (a regular expression)", field=at)
    pattern = compile_regex(raw, field=at)
    if pattern.units > MAX_REDACT_PROGRAM:
        raise InvalidParams(
            f"a redact pattern compiles to at most {MAX_REDACT_PROGRAM} RE2 instructions, not "
            f"{pattern.units}: it runs over every token's window",
            field=at,
        )
    if pattern.search("") is not None:
        raise InvalidParams("pattern matches the empty string", field=at)
    return pattern


# --- redaction ---------------------------------------------------------------------------------


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort and merge overlapping or touching ``[start, end)`` spans."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _spans(text: str, patterns: Sequence[Pattern]) -> list[tuple[int, int]]:
    return _merge(
        (m.start(), m.end()) for p in patterns for m in p.finditer(text) if m.end() > m.start()
    )


def redact_text(text: str, patterns: Sequence[Pattern], mask: str = DEFAULT_MASK) -> str:
    """Replace every match of every pattern with ``mask``.

    All patterns run on the original text (a mask is never matched again); empty matches are
    ignored; overlapping or touching matches merge into one span and one mask.
    """
    if not patterns:
        return text
    out: list[str] = []
    pos = 0
    for start, end in _spans(text, patterns):
        out.append(text[pos:start])
        out.append(mask)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_json(value: Any, patterns: Sequence[Pattern], mask: str = DEFAULT_MASK) -> Any:
    """Redact every string value (not object keys) in a JSON value, recursively.

    Returns a new value; lists stay lists, tuples stay tuples, other scalars are unchanged.
    """
    if not patterns:
        return value
    if isinstance(value, str):
        return redact_text(value, patterns, mask)
    if isinstance(value, Mapping):
        return {k: redact_json(v, patterns, mask) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_json(v, patterns, mask) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_json(v, patterns, mask) for v in value)
    return value


class StreamRedactor:
    """Redact a stream of token texts, releasing each token once it is safe.

    ``push(text)`` takes the next token's text and returns the texts of the tokens now safe to
    release; ``flush()`` ends the stream and returns the rest. Every input token comes out
    exactly once, in order, as one entry (possibly ``""``), so callers can keep token indices
    and ids aligned: over a whole stream ``len(outputs) == len(inputs)``.

    A token is held while any of it lies within the last ``window_chars`` characters of the
    stream. When tokens are released, the patterns are applied (to the original text, as in
    :func:`redact_text`) and each released token is emitted with the covered parts removed;
    the mask goes into the token where a merged span starts, and the covered parts of later
    tokens become empty. The concatenated output then equals ``redact_text`` of the whole
    stream.

    Window limitation: that equality holds whenever every match, together with the text a
    pattern looks at around it to decide it (lookbehind, lookahead, ``\\b``, ``$``), is shorter
    than ``window_chars``. A longer match may be cut at the window (its head is masked and the
    rest escapes unredacted), or missed entirely when less than the pattern's minimal match
    length fits in the window. Choose ``window_chars`` above the longest secret the patterns
    describe. The held-back text adds up to ``window_chars`` characters of latency.

    With no patterns, ``push`` returns ``[text]`` at once and nothing is held.
    ``flush`` resets the redactor, so it can serve another stream.
    """

    def __init__(
        self,
        patterns: Sequence[Pattern],
        *,
        window_chars: int = 64,
        mask: str = DEFAULT_MASK,
    ) -> None:
        if window_chars < 1:
            raise ValueError("window_chars must be at least 1")
        self._patterns = tuple(patterns)
        self._window = window_chars
        self._mask = mask
        self._reset()

    def _reset(self) -> None:
        self._buf = ""  # original text from absolute offset self._base on
        self._base = 0
        self._total = 0
        self._held: deque[tuple[int, int]] = deque()  # absolute [start, end) of held tokens
        self._scan = [0] * len(self._patterns)  # where each pattern's match search resumes
        self._spans: list[tuple[int, int]] = []  # merged spans that reach the held tokens

    @property
    def held(self) -> int:
        """How many tokens are held back now."""
        return len(self._held)

    def push(self, text: str) -> list[str]:
        if not self._patterns:
            return [text]
        start = self._total
        self._total += len(text)
        self._buf += text
        self._held.append((start, self._total))
        limit = self._total - self._window
        count = 0
        for _, end in self._held:
            if end > limit:
                break
            count += 1
        if count == 0:
            return []
        return self._release(count, self._held[count - 1][1])

    def flush(self) -> list[str]:
        if not self._patterns or not self._held:
            self._reset()
            return []
        out = self._release(len(self._held), self._total)
        self._reset()
        return out

    def _release(self, count: int, boundary: int) -> list[str]:
        self._commit(boundary)
        out = [self._render(*self._held.popleft()) for _ in range(count)]
        # Keep spans that could still cover or touch what is held, and enough released text
        # for lookbehinds to see.
        self._spans = [s for s in self._spans if s[1] >= boundary]
        keep_from = max(self._base, boundary - self._window)
        self._buf = self._buf[keep_from - self._base :]
        self._base = keep_from
        return out

    def _commit(self, boundary: int) -> None:
        """Find, for each pattern, every match that starts before ``boundary``."""
        base = self._base
        found: list[tuple[int, int]] = []
        for i, pattern in enumerate(self._patterns):
            resume = self._scan[i]
            for m in pattern.finditer(self._buf, resume - base):
                if m.start() + base >= boundary:
                    break
                if m.end() > m.start():
                    found.append((m.start() + base, m.end() + base))
                resume = m.end() + base
            self._scan[i] = max(resume, boundary)
        if found:
            self._spans = _merge([*self._spans, *found])

    def _render(self, start: int, end: int) -> str:
        if start == end:
            return ""
        base = self._base
        out: list[str] = []
        pos = start
        for s, e in self._spans:
            if e <= start:
                continue
            if s >= end:
                break
            if s > pos:
                out.append(self._buf[pos - base : s - base])
            if s >= start:
                out.append(self._mask)
            pos = min(e, end)
            if pos >= end:
                break
        if pos < end:
            out.append(self._buf[pos - base : end - base])
        return "".join(out)
