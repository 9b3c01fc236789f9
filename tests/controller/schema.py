"""A custom resource's structural schema as the API server applies it on every create and update:
pruning, defaulting, OpenAPI v3 validation and ``x-kubernetes-validations`` (CEL, evaluated with
cel-python), answered as the API server's 422 ``Invalid`` ``Status`` with one cause per error.

The subset is what ``modelservice-crd.yaml`` uses: ``type`` (object, array, string, integer, number,
boolean), ``nullable``, ``required``, ``properties``, ``additionalProperties`` (a schema),
``minProperties``, ``items``, ``enum``, ``minimum``/``maximum``,
``minItems``/``maxItems``, ``minLength``/``maxLength``, ``pattern``, ``format: date-time``,
``default``, ``x-kubernetes-preserve-unknown-fields`` and ``x-kubernetes-validations`` (``rule``,
``message``; ``self`` only).

As the API server does, the CEL rules run only once the OpenAPI validation found no blocking error
(a wrong type, a missing required field, a value not in an enum, too many items, too long): with
one, they are not run and a cause says so instead.

Not emulated: ``oldSelf`` (transition rules), ``messageExpression``, ``reason``/``fieldPath`` of a
rule, CEL cost limits, ``additionalProperties: false``, ``maxProperties``, ``oneOf``/``anyOf``/``allOf``/``not``,
``x-kubernetes-int-or-string``, ``x-kubernetes-list-type``/``-map-keys``, ``x-kubernetes-embedded-resource``,
formats other than ``date-time``, and ``metadata`` validation beyond what the emulator already does.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import re
from typing import Any

import celpy

Cause = dict[str, str]
#: An OpenAPI error that stops the CEL rules from running (the API server's ``hasBlockingErr``).
BLOCKING = {
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
}
UNCHECKED: Cause = {
    "field": "<nil>",
    "reason": "FieldValueInvalid",
    "message": "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
}


def _type_ok(kind: str | None, value: Any) -> bool:
    if kind is None:
        return True
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":  # a whole number written as a float (5.0) is one too
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


_GO_TYPES = {"object": "object", "array": "array", "string": "string", "integer": "integer", "number": "number"}


def _date_time(value: str) -> bool:
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return "T" in value


_ABSENT: Any = object()
"""No stored counterpart (a create, or a field the stored object lacks)."""


def _get(old: Any, key: str) -> Any:
    return old.get(key, _ABSENT) if isinstance(old, dict) else _ABSENT


class Structural:
    """One version's ``openAPIV3Schema``: :meth:`admit` prunes, defaults and validates an object."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._cel = celpy.Environment()
        self._programs: dict[str, Any] = {}

    def admit(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Cause]]:
        """(the object pruned and defaulted, the causes of its rejection: empty when valid).
        ``apiVersion``, ``kind`` and ``metadata`` are kept as they are, as the API server does. On an
        update (``old``), a value equal to the stored one is not validated again (validation
        ratcheting, on by default since Kubernetes 1.30): a status write to an object whose spec
        predates a stricter CRD goes through."""
        obj = copy.deepcopy(obj)
        old = old or {}
        causes: list[Cause] = []
        rules: list[_Rule] = []
        props = self.schema.get("properties") or {}
        for key in list(obj):
            if key in ("apiVersion", "kind", "metadata"):
                continue
            if key not in props:
                del obj[key]  # pruned
                continue
            obj[key] = self._walk(props[key], obj[key], key, causes, rules, old.get(key, _ABSENT))
        for key in self.schema.get("required") or ():
            if key not in obj:
                causes.append(_cause("FieldValueRequired", key, "Required value"))
        if any(c["reason"] in BLOCKING for c in causes):
            causes.append(dict(UNCHECKED))
        else:
            for rule in rules:
                if not self._cel_ok(rule.rule, rule.value):
                    causes.append(_cause("FieldValueInvalid", rule.path, f"Invalid value: {rule.message}"))
        return obj, causes

    def _walk(
        self,
        schema: dict[str, Any],
        value: Any,
        path: str,
        causes: list[Cause],
        rules: list[_Rule],
        old: Any = _ABSENT,
    ) -> Any:
        if old is not _ABSENT and old == value:
            causes, rules = [], []  # ratcheting: unchanged, so its errors are not reported
            old = _ABSENT
        if value is None:
            if not schema.get("nullable"):
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f'Invalid value: "null": {path} in body must be of type {schema.get("type")}: "null"',
                    )
                )
            return value
        kind = schema.get("type")
        if not _type_ok(kind, value):
            causes.append(
                _cause(
                    "FieldValueTypeInvalid",
                    path,
                    f'Invalid value: "{_go_type(value)}": {path} in body must be of type {_GO_TYPES.get(kind, kind)}: '
                    f'"{_go_type(value)}"',
                )
            )
            if kind == "integer" and isinstance(value, float):
                # The integer format, checked apart from the type.
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        "<nil>",
                        f'Invalid value: "": Checked value must be of type integer (default format) in {path}',
                    )
                )
            return value
        if kind == "integer" and isinstance(value, float):
            value = int(value)  # stored, and read back, as the integer
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            preserve = schema.get("x-kubernetes-preserve-unknown-fields")
            extra = schema.get("additionalProperties")
            for key in list(value):
                if key in props:
                    value[key] = self._walk(props[key], value[key], f"{path}.{key}", causes, rules, _get(old, key))
                elif isinstance(extra, dict):
                    value[key] = self._walk(extra, value[key], f"{path}.{key}", causes, rules, _get(old, key))
                elif not preserve:
                    del value[key]  # pruned
            if "minProperties" in schema and len(value) < schema["minProperties"]:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {len(value)}: {path} in body should have at least "
                        f"{schema['minProperties']} properties",
                    )
                )
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
            for key in schema.get("required") or ():
                if key not in value:
                    causes.append(_cause("FieldValueRequired", f"{path}.{key}", "Required value"))
        elif isinstance(value, list):
            items = schema.get("items")
            if items is not None:
                value[:] = [self._walk(items, v, f"{path}[{i}]", causes, rules) for i, v in enumerate(value)]
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                causes.append(
                    _cause(
                        "FieldValueTooMany",
                        path,
                        f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                    )
                )
            if "minItems" in schema and len(value) < schema["minItems"]:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {len(value)}: {path} in body should have at least {schema['minItems']} items",
                    )
                )
        else:
            self._scalar(schema, value, path, causes)
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(f'"{v}"' for v in schema["enum"])
            causes.append(
                _cause("FieldValueNotSupported", path, f'Unsupported value: "{value}": supported values: {allowed}')
            )
        for check in schema.get("x-kubernetes-validations") or ():
            rules.append(_Rule(path, check["rule"], check.get("message") or f"failed rule: {check['rule']}", value))
        return value

    def _scalar(self, schema: dict[str, Any], value: Any, path: str, causes: list[Cause]) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {value}: {path} in body should be "
                        f"greater than or equal to {schema['minimum']}",
                    )
                )
            if "maximum" in schema and value > schema["maximum"]:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {value}: {path} in body should be less than or equal to {schema['maximum']}",
                    )
                )
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                causes.append(
                    _cause("FieldValueTooLong", path, f"Too long: may not be more than {schema['maxLength']} bytes")
                )
            if "minLength" in schema and len(value) < schema["minLength"]:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f'Invalid value: "{value}": {path} in body should be at least {schema["minLength"]} chars long',
                    )
                )
            if "pattern" in schema and not re.search(schema["pattern"], value):
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: \"{value}\": {path} in body should match '{schema['pattern']}'",
                    )
                )
            if schema.get("format") == "date-time" and not _date_time(value):
                causes.append(
                    _cause(
                        "FieldValueInvalid", path, f'Invalid value: "{value}": {path} in body must be of type date-time'
                    )
                )

    def _cel_ok(self, rule: str, value: Any) -> bool:
        if rule not in self._programs:
            self._programs[rule] = self._cel.program(self._cel.compile(rule))
        try:
            return bool(self._programs[rule].evaluate({"self": celpy.json_to_cel(value)}))
        except Exception:  # a rule that errors (no such key, ...) rejects, as on the API server
            return False


@dataclasses.dataclass(frozen=True)
class _Rule:
    """A CEL rule met on the walk, run once the OpenAPI validation is done (and not blocking)."""

    path: str
    rule: str
    message: str
    value: Any


def _go_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _cause(reason: str, field: str, message: str) -> Cause:
    return {"reason": reason, "message": message, "field": field}


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> dict[str, Any]:
    """The API server's 422 answer (``StatusReasonInvalid``): ``<Kind>.<group> "<name>" is invalid:``
    followed by every cause as ``field: message``."""
    joined = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
    summary = f"[{joined}]" if len(causes) > 1 else joined
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'{kind}.{group} "{name}" is invalid: {summary}',
        "reason": "Invalid",
        "details": {"name": name, "group": group, "kind": kind, "causes": causes},
        "code": 422,
    }
