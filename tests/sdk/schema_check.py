"""A tiny JSON-schema check for the keywords the structured-output tests use (no dependency)."""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def problems(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Why `value` does not match `schema` (type, enum, const, maxLength, properties,
    required, additionalProperties: false); empty when it matches."""
    found: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        bad_bool = isinstance(value, bool) and kind in ("integer", "number")
        if not isinstance(value, _TYPES[kind]) or bad_bool:
            return [f"{where}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        found.append(f"{where}: {value!r} is not {schema['const']!r}")
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        found.append(f"{where}: {value!r} is longer than {schema['maxLength']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        missing = [key for key in schema.get("required", ()) if key not in value]
        found += [f"{where}: {key!r} is missing" for key in missing]
        for key, item in value.items():
            if key in properties:
                found += problems(item, properties[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                found.append(f"{where}: {key!r} is not allowed")
    return found
