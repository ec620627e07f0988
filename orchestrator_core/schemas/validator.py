"""The validator a client's schema runs on: jsonschema's Draft 2020-12, with what a hostile
schema or value could make unbounded replaced.

- ``pattern``, ``patternProperties``, and the two keywords that read ``patternProperties``
  to decide what is left over (``additionalProperties``, ``unevaluatedProperties``) match
  with RE2 (``orchestrator_core.regexes``) instead of Python's backtracking ``re``; a match
  that could take past the deadline (``bounds.NS_PER_REGEX_UNIT``) is not started, and the
  string is reported as too long for that pattern.
- ``uniqueItems`` hashes each item once (jsonschema compares every pair when items are
  objects: 14 s for 3,000 of them); equality is still JSON's (``1 == 1.0``, ``true != 1``).
- Every keyword looks at the deadline before it runs.
- ``$ref`` resolves inside the schema or against the bundled meta-schemas; nothing is
  retrieved (jsonschema's default registry would fetch an ``http`` reference, synchronously).

The two keywords jsonschema keeps their helpers private for are copied here with RE2 in
place of ``re``; ``tests/core/test_schema_validator.py`` checks them against jsonschema on
schemas both can run.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
import referencing
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema._utils import extras_msg  # (messages worded as jsonschema words them)
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from orchestrator_core.regexes import Regex, RegexError, schema_regex
from orchestrator_core.schemas.bounds import check_deadline, current

Keyword = Callable[[Any, Any, Any, dict[str, Any]], Iterator[ValidationError] | None]

_BASE = Draft202012Validator.VALIDATORS
_NO_REFERENCES: referencing.Registry[Any] = referencing.Registry()


def _timed(keyword: Keyword) -> Keyword:
    def timed(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        check_deadline()
        return keyword(validator, value, instance, schema)

    return timed


# --- regexes -----------------------------------------------------------------------------------


def _regex(pattern: str) -> Regex | str:
    """The compiled pattern, or why it cannot run (a schema stored before RE2 refused it)."""
    try:
        return schema_regex(pattern)
    except RegexError as exc:
        return f"the schema's pattern {pattern!r} cannot run on RE2 ({exc})"


def _search(regex: Regex, text: str) -> bool | None:
    """Whether ``regex`` matches in ``text``; None when the match could outlast the deadline."""
    size = len(text) if text.isascii() else 4 * len(text)  # UTF-8 bytes, at most
    if size * regex.units > current().regex_units:
        return None
    return regex.search(text) is not None


def _too_long(text: str, pattern: str) -> str:
    return (
        f"is {len(text)} characters, too long to be checked against {pattern!r} within the "
        "validation deadline"
    )


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    if not validator.is_type(instance, "string"):
        return
    check_deadline()
    regex = _regex(pattern)
    if isinstance(regex, str):
        yield ValidationError(regex)
        return
    found = _search(regex, instance)
    if found is None:
        yield ValidationError(_too_long(instance, pattern))
    elif not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _regex(pattern)
        if isinstance(regex, str):
            yield ValidationError(regex)
            continue
        for name, value in instance.items():
            check_deadline()
            found = _search(regex, name)
            if found is None:
                yield ValidationError(_too_long(name, pattern), path=[name])
            elif found:
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _named_by_patterns(schema: dict[str, Any]) -> Callable[[str], bool]:
    regexes = [
        r for r in map(_regex, schema.get("patternProperties", {})) if not isinstance(r, str)
    ]
    return lambda name: any(_search(r, name) for r in regexes)


def additional(instance: Mapping[str, Any], schema: Any) -> list[str]:
    """The properties of ``instance`` that neither ``properties`` nor ``patternProperties``
    of ``schema`` name (jsonschema's ``find_additional_properties``, on RE2)."""
    if not isinstance(schema, dict):
        return list(instance)
    properties = schema.get("properties", {})
    patterned = _named_by_patterns(schema)
    out = []
    for name in instance:
        check_deadline()
        if name not in properties and not patterned(name):
            out.append(name)
    return out


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: dict[str, Any]) -> Any:
    if not validator.is_type(instance, "object"):
        return
    extras = additional(instance, schema)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            error = "Additional properties are not allowed (%s %s unexpected)"
            yield ValidationError(error % extras_msg(sorted(extras, key=str)))


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator: Any, instance: Any, schema: Any) -> set[str]:
    """jsonschema's ``find_evaluated_property_keys_by_schema``, on RE2."""
    if validator.is_type(schema, "boolean"):
        return set()
    check_deadline()
    keys: set[str] = set()
    for keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(keyword)
        if ref is not None:
            resolved = validator._resolver.lookup(ref)
            inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(inner, instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        subschema = schema.get(keyword)
        if subschema is not None:
            keys |= {k for k, v in instance.items() if _valid(validator.descend(v, subschema))}
    if "patternProperties" in schema:
        patterned = _named_by_patterns(schema)
        keys |= {name for name in instance if patterned(name)}
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _valid(validator.descend(instance, subschema)):
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator: Any, up: Any, instance: Any, schema: dict[str, Any]) -> Any:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    unevaluated = []
    for name in instance:
        if name not in evaluated:
            for _ in validator.descend(instance[name], up, path=name, schema_path=name):
                unevaluated.append(name)
    if not unevaluated:
        return
    if up is False:
        error = "Unevaluated properties are not allowed (%s %s unexpected)"
        yield ValidationError(error % extras_msg(sorted(unevaluated, key=str)))
    else:
        error = (
            "Unevaluated properties are not valid under the given schema "
            "(%s %s unevaluated and invalid)"
        )
        yield ValidationError(error % extras_msg(unevaluated))


# --- uniqueItems -------------------------------------------------------------------------------


def _hashable(value: Any) -> Any:
    """A key equal for JSON-equal values: ``1`` and ``1.0`` alike, ``true`` and ``1`` not."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_hashable(v) for v in value))
    return ("value", value)  # strings and numbers: Python's equality is JSON's


def _unique_items(validator: Any, unique: Any, instance: Any, schema: dict[str, Any]) -> Any:
    if not unique or not validator.is_type(instance, "array"):
        return
    check_deadline()
    seen: set[Any] = set()
    for item in instance:
        key = _hashable(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


# --- the class ---------------------------------------------------------------------------------

_REPLACED: dict[str, Keyword] = {
    **_BASE,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
    "uniqueItems": _unique_items,
}
# Every keyword looks at the deadline (a tenth of a microsecond, against the one to three a
# keyword costs): a loop over a value's parts (``items``, ``additionalProperties``) reaches it
# through the keywords of each part, whatever they are.
_REPLACED = {name: _timed(keyword) for name, keyword in _REPLACED.items()}
BoundedValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, _REPLACED
)


@functools.cache
def schema_formats() -> FormatChecker:
    """The meta-schema's format checks, less ``regex``: RE2 judges patterns, naming the field
    (``rules.Regexes``), where Python's ``re`` would both judge them by another dialect and
    compile a client's pattern."""
    checker = FormatChecker(formats=())
    checker.checkers = {
        name: check
        for name, check in Draft202012Validator.FORMAT_CHECKER.checkers.items()
        if name != "regex"
    }
    return checker


@functools.cache
def _meta_validator() -> Validator:
    return BoundedValidator(
        Draft202012Validator.META_SCHEMA, format_checker=schema_formats(), registry=_NO_REFERENCES
    )


def meta_error(schema: Any) -> str | None:
    """Why ``schema`` is not a JSON Schema 2020-12 (the first error, as jsonschema's
    ``check_schema`` reports it), or None; under the deadline, about a millisecond per
    subschema."""
    error = next(iter(_meta_validator().iter_errors(schema)), None)
    return None if error is None else error.message


def key_of(schema: Any) -> bytes:
    """The schema's exact JSON, keys sorted: equal schemas share what is compiled for them.
    Not the canonical form: NFC normalization would merge different property spellings."""
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        return json.dumps(schema, sort_keys=True).encode()


CACHE_SIZE = 512


@functools.lru_cache(maxsize=CACHE_SIZE)
def compiled(key: bytes) -> Validator:
    """The validator of the schema whose :func:`key_of` is ``key``."""
    # from the key's own copy: later changes to the caller's dict cannot make the validator
    # disagree with its key. json, not orjson, reads big integers exactly.
    return BoundedValidator(json.loads(key), registry=_NO_REFERENCES)


def validator_for(schema: Any) -> Validator:
    """The compiled validator of ``schema``, shared by every equal schema."""
    return compiled(key_of(schema))
