"""JSON-schema validation for the structured-output tests (the `jsonschema` package)."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator


def problems(value: Any, schema: dict[str, Any]) -> list[str]:
    """Why `value` does not match `schema`, one line per error; empty when it matches."""
    return [
        f"{error.json_path}: {error.message}"
        for error in Draft202012Validator(schema).iter_errors(value)
    ]
