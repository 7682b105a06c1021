"""The reference's error body, `{"detail": …}` (plus `message`), and that message alone."""

from __future__ import annotations

import json
from typing import Any, Final

MESSAGE_ITEMS: Final = 3
"""How many items of a 422 list `error_message` names."""


def error_body(detail: Any, *, with_message: bool, code: str | None = None) -> bytes:
    """`{"detail": ...}` as compact JSON with raw UTF-8 (unpaired surrogates are escaped).

    With `with_message` (README divergence 12; off with --reference-errors) the body also carries
    `"message": error_message(detail)`, the field OpenAI's SDKs print as the exception text,
    and `"code"` where OpenAI has one for the error (`model_not_found`).
    """
    content = {"detail": detail}
    if with_message:
        content["message"] = error_message(detail)
        if code is not None:
            content["code"] = code
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def error_message(detail: Any) -> str:
    """An error's `detail` as one line: the text itself, or a 422 list summarised as
    `loc: msg` per item (`body.messages.0.role: Input should be ...`), the first
    MESSAGE_ITEMS of them and how many more there are."""
    if isinstance(detail, str):
        return detail
    if not isinstance(detail, list):
        return json.dumps(detail, ensure_ascii=False)
    parts = [_item_summary(item) for item in detail[:MESSAGE_ITEMS]]
    more = len(detail) - MESSAGE_ITEMS
    if more > 0:
        parts.append(f"and {more} more error{'s' if more > 1 else ''}")
    return "; ".join(parts)


def _item_summary(item: Any) -> str:
    """One 422 item as `loc: msg`, with the decoder's reason for a json_invalid item."""
    if not isinstance(item, dict) or "msg" not in item:
        return json.dumps(item, ensure_ascii=False)
    loc = ".".join(str(part) for part in item.get("loc", ()))
    msg = str(item["msg"])
    reason = (item.get("ctx") or {}).get("error")
    if isinstance(reason, str) and reason not in msg:
        msg = f"{msg} ({reason})"
    return f"{loc}: {msg}" if loc else msg
