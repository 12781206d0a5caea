"""Structural OpenAPI v3 schemas of CustomResourceDefinitions: pruning, defaulting
and validation, as the apiextensions apiserver applies them to custom resources.

Supported: type (object, array, string, integer, number, boolean), nullable,
properties, additionalProperties, items, required, enum, minimum/maximum (with
exclusiveMinimum/exclusiveMaximum), minLength/maxLength, pattern,
minItems/maxItems, default, x-kubernetes-preserve-unknown-fields,
x-kubernetes-int-or-string, and x-kubernetes-validations rules in the CEL subset
of cel.py (others are skipped with a note on stderr). Not supported: format
checks, oneOf/anyOf/allOf/not, x-kubernetes-list-type uniqueness.
Errors are (reason, field, message) triples worded as field.Error renders them.
"""

import copy
import json
import re
import sys

import cel

_ROOT_KEPT = ("apiVersion", "kind", "metadata")
_skipped_rules = set()


def _join(path, key):
    return "%s.%s" % (path, key) if path else key


def _keeps_unknown(schema):
    return (schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
            or "properties" not in schema and schema.get("type") != "object")


def prune(schema, obj, path=""):
    """Removes fields the schema does not declare; returns their paths (for strict
    field validation and warnings)."""
    unknown = []
    if isinstance(obj, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties", {})
        for key in list(obj):
            if path == "" and key in _ROOT_KEPT:
                continue
            sub = props.get(key)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                unknown += prune(sub, obj[key], _join(path, key))
            elif not _keeps_unknown(schema):
                unknown.append(_join(path, key))
                del obj[key]
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            unknown += prune(schema["items"], item, "%s[%d]" % (path, i))
    return unknown


def apply_defaults(schema, obj):
    """Fills in `default`s of absent (or non-nullable null) properties, parents first,
    so that a defaulted object gets its children's defaults too."""
    if isinstance(obj, dict):
        for key, sub in schema.get("properties", {}).items():
            if obj.get(key) is None and key in obj and not sub.get("nullable"):
                del obj[key]
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(sub, obj[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                if key not in schema.get("properties", {}):
                    apply_defaults(extra, obj[key])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(schema["items"], item)


def validate(schema, obj, path=""):
    """The schema violations in obj, as (reason, field, message) triples."""
    errs = []
    _check(schema, obj, path, errs)
    return errs


def _show(value):
    return json.dumps(value) if not isinstance(value, (dict, list)) else '"%s"' % type(value).__name__


def _type_ok(schema, value):
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    want = schema.get("type")
    return {
        None: True,
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
    }.get(want, True)


def _invalid(errs, path, value, why):
    errs.append(("FieldValueInvalid", path, "Invalid value: %s: %s in body %s" % (_show(value), path, why)))


def _check(schema, value, path, errs):
    if value is None:
        if not schema.get("nullable"):
            errs.append(("FieldValueTypeInvalid", path, "Invalid value: \"null\": %s in body must be of type %s: \"null\""
                         % (path, schema.get("type", "object"))))
        return
    if not _type_ok(schema, value):
        kind = {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(value), "number")
        if isinstance(value, int) and not isinstance(value, bool):
            kind = "integer"
        errs.append(("FieldValueTypeInvalid", path, "Invalid value: %s: %s in body must be of type %s: \"%s\""
                     % (_show(value), path, schema.get("type", "integer or string"), kind)))
        return
    if "enum" in schema and value not in schema["enum"]:
        errs.append(("FieldValueNotSupported", path, "Unsupported value: %s: supported values: %s"
                     % (_show(value), ", ".join(_show(v) for v in schema["enum"]))))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(schema, value, path, errs)
    if isinstance(value, str):
        _check_string(schema, value, path, errs)
    if isinstance(value, list):
        _check_array(schema, value, path, errs)
    if isinstance(value, dict):
        _check_object(schema, value, path, errs)
    for rule in schema.get("x-kubernetes-validations") or []:
        _check_rule(schema, rule, value, path, errs)


def _check_rule(schema, rule, value, path, errs):
    try:
        if cel.check(rule["rule"], value):
            return
    except cel.Unsupported as e:
        if rule["rule"] not in _skipped_rules:
            _skipped_rules.add(rule["rule"])
            sys.stderr.write("apiserver: CEL rule not evaluated (%s): %s\n" % (e, rule["rule"]))
        return
    message = rule.get("message") or "failed rule: %s" % rule["rule"]
    reason = rule.get("reason", "FieldValueInvalid")
    field = path + rule.get("fieldPath", "") if path or not rule.get("fieldPath") else rule["fieldPath"].lstrip(".")
    text = {"FieldValueForbidden": "Forbidden: %s", "FieldValueRequired": "Required value: %s",
            "FieldValueDuplicate": "Duplicate value: %s"}.get(reason)
    errs.append((reason, field, text % message if text else 'Invalid value: "%s": %s'
                 % (schema.get("type", "object"), message)))


def _check_number(schema, value, path, errs):
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or schema.get("exclusiveMinimum") and value == low:
            _invalid(errs, path, value, "should be greater than %s%s"
                     % ("" if schema.get("exclusiveMinimum") else "or equal to ", low))
    if "maximum" in schema:
        high = schema["maximum"]
        if value > high or schema.get("exclusiveMaximum") and value == high:
            _invalid(errs, path, value, "should be less than %s%s"
                     % ("" if schema.get("exclusiveMaximum") else "or equal to ", high))


def _check_string(schema, value, path, errs):
    if len(value) < schema.get("minLength", 0):
        _invalid(errs, path, value, "should be at least %d chars long" % schema["minLength"])
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errs.append(("FieldValueTooLong", path, "Too long: may not be more than %d bytes" % schema["maxLength"]))
    if "pattern" in schema and not re.search(schema["pattern"], value):
        _invalid(errs, path, value, "should match '%s'" % schema["pattern"])


def _check_array(schema, value, path, errs):
    if len(value) < schema.get("minItems", 0):
        _invalid(errs, path, value, "should have at least %d items" % schema["minItems"])
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errs.append(("FieldValueTooMany", path, "Too many: %d: must have at most %d items"
                     % (len(value), schema["maxItems"])))
    if isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _check(schema["items"], item, "%s[%d]" % (path, i), errs)


def _check_object(schema, value, path, errs):
    for key in schema.get("required", []):
        if key not in value:
            errs.append(("FieldValueRequired", _join(path, key), "Required value"))
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if path == "" and key in _ROOT_KEPT:
            continue
        if key in props:
            _check(props[key], item, _join(path, key), errs)
        elif isinstance(extra, dict):
            _check(extra, item, "%s[%s]" % (path, key), errs)
