"""reference-api.md §3.1 (E2–E14) and §4 (every 422 body) over HTTP, byte-exact.

Media-URL rows run in both modes: edgeserve validates streams before the first byte
(PRODUCT.md 3.1 divergence 1), so the stream answer is the same clean JSON error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeserve.engine.client import EngineClient
from tests.conformance.wire import (
    ASSISTANT,
    CHAT,
    JSON,
    SCORE,
    SYSTEM,
    TOOL,
    USER,
    assert_error,
    chat,
    detail,
    media,
    post,
    send,
)

E9 = "Invalid URL: 400: Only HTTP/HTTPS URLs are allowed."
E10 = "Invalid URL: 400: Invalid URL hostname."
E11 = "Invalid URL: 403: Access to private or reserved IP addresses is not allowed."

# (chat body without "stream", status, detail); one line per case.
CHAT_ERRORS = [
    pytest.param(chat(messages=[]), 400, "Invalid length", id="E3-empty"),
    pytest.param(chat(messages=[], tools=[TOOL], n=2), 400, "Invalid length", id="E3-tools-n"),
    pytest.param(chat(SYSTEM), 400, "Only supports u/a/u/a/u...", id="E4-only-system"),
    pytest.param(chat(USER, ASSISTANT), 400, "Only supports u/a/u/a/u...", id="E4-two"),
    pytest.param(
        chat(SYSTEM, USER, ASSISTANT), 400, "Only supports u/a/u/a/u...", id="E4-system-two"
    ),
    pytest.param(chat(SYSTEM, SYSTEM, USER), 400, "Only supports u/a/u/a/u...", id="E4-2sys"),
    pytest.param(chat(ASSISTANT), 400, "Invalid role", id="E5-assistant-first"),
    pytest.param(chat({"role": "function", "content": "x"}), 400, "Invalid role", id="E5-fn0"),
    pytest.param(chat(USER, USER, USER), 400, "Invalid role", id="E5-user-odd"),
    pytest.param(
        chat(USER, {"role": "tool", "content": "r"}, USER), 400, "Invalid role", id="E5-tool-odd"
    ),
    pytest.param(chat(USER, ASSISTANT, SYSTEM), 400, "Invalid role", id="E5-late-system"),
    pytest.param(chat(SYSTEM, SYSTEM, USER, ASSISTANT), 400, "Invalid role", id="E5-2sys-odd"),
    pytest.param(chat(media("file:///etc/hosts_nope")), 400, E9, id="E9-file-scheme"),
    pytest.param(chat(media("ftp://example.com/x.png")), 400, E9, id="E9-ftp"),
    pytest.param(chat(media("cat.png")), 400, E9, id="E9-relative-name"),
    pytest.param(chat(media("/nonexistent/x.png")), 400, E9, id="E9-missing-path"),
    pytest.param(chat(media("//host/x.png")), 400, E9, id="E9-scheme-relative"),
    pytest.param(chat(media("data:image/webp;base64,AAAA")), 400, E9, id="E9-webp"),
    pytest.param(chat(media("data:image/png;base64,")), 400, E9, id="E9-empty-data"),
    pytest.param(chat(media("data:video/webm;base64,AAAA", "video_url")), 400, E9, id="E9-webm"),
    pytest.param(chat(media("data:audio/flac;base64,AAAA", "audio_url")), 400, E9, id="E9-flac"),
    pytest.param(
        chat(media("DATA:image/png;base64,AAAA")), 400, E9, id="E9-data-is-case-sensitive"
    ),
    pytest.param(chat(media("data:image/png;base64,AAAA", "video_url")), 400, E9, id="E9-kind"),
    pytest.param(chat(media("data:image/png,AAAA")), 400, E9, id="E9-data-not-base64"),
    pytest.param(chat(media("")), 400, E9, id="E9-empty-url"),
    pytest.param(chat(media("javascript:alert(1)")), 400, E9, id="E9-javascript"),
    pytest.param(chat(media("http:///x.png")), 400, E10, id="E10-http"),
    pytest.param(chat(media("https:///x.png", "audio_url")), 400, E10, id="E10-https"),
    pytest.param(chat(media("http://127.0.0.1/x.png")), 400, E11, id="E11-127.0.0.1"),
    pytest.param(chat(media("http://localhost/x.png")), 400, E11, id="E11-localhost"),
    pytest.param(chat(media("https://LOCALHOST:8443/x")), 400, E11, id="E11-LOCALHOST-port"),
    pytest.param(chat(media("http://[::1]/x.png")), 400, E11, id="E11-ipv6-loopback"),
    pytest.param(chat(media("http://10.0.0.1/x.png")), 400, E11, id="E11-10/8"),
    pytest.param(chat(media("http://169.254.169.254/latest/meta-data/")), 400, E11, id="E11-imds"),
    pytest.param(chat(media("http://0.0.0.0/x.png", "video_url")), 400, E11, id="E11-0.0.0.0"),
    pytest.param(chat(media("http://[fe80::1]/x.png")), 400, E11, id="E11-link-local"),
    pytest.param(chat(media("http://[::ffff:127.0.0.1]/x")), 400, E11, id="E11-v4-mapped"),
    pytest.param(chat(media("http://2130706433/x.png")), 400, E11, id="E11-decimal-ip"),
    pytest.param(chat(media("http://0x7f.1/x.png")), 400, E11, id="E11-hex-short-ip"),
    pytest.param(chat(media("http://user:pw@127.0.0.1/x")), 400, E11, id="E11-userinfo"),
    pytest.param(chat(media("HTTP://127.0.0.1/x.png")), 400, E11, id="E11-upper-scheme"),
    pytest.param(chat(media("http://192.168.1.1/x.png")), 400, E11, id="E11-192.168"),
    pytest.param(chat(media("http://100.64.0.1/x.png")), 400, E11, id="E11-cgnat"),
    pytest.param(
        chat(media("http://nothing.invalid/x.png")),
        400,
        "Could not resolve hostname: nothing.invalid",
        id="E12-invalid-tld",
    ),
    pytest.param(
        chat(media("https://Upper.Case.INVALID:8080/x.png")),
        400,
        "Could not resolve hostname: upper.case.invalid",
        id="E12-lowercased",
    ),
    pytest.param(
        chat(media("http://bücher.invalid/x.png")),
        400,
        "Could not resolve hostname: bücher.invalid",
        id="E12-idn",
    ),
    pytest.param(
        chat(media("http://127.0.0.1:abc/x")),
        400,
        "Invalid URL: Port could not be cast to integer value as 'abc'",
        id="E13-port-text",
    ),
    pytest.param(
        chat(media("http://127.0.0.1:99999/x")),
        400,
        "Invalid URL: Port out of range 0-65535",
        id="E13-port-range",
    ),
    pytest.param(chat(media("http://[::1/x")), 400, "Invalid URL: Invalid IPv6 URL", id="E13-ipv6"),
    pytest.param(
        chat(media("http://a..b/x")),
        400,
        "Invalid URL: encoding with 'idna' codec failed (UnicodeError: label empty or too long)",
        id="E13-idna",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("body", "status", "text"), CHAT_ERRORS)
async def test_chat_error_table(client, body, status, text, stream):
    reply = await post(client, CHAT, {**body, "stream": stream})
    assert_error(reply, status, detail(text))


async def test_e2_not_allowed_on_a_model_that_cannot_generate(make_client, monkeypatch):
    # The capability flag is the only thing changed: the real engine answers nothing here.
    monkeypatch.setattr(EngineClient, "can_generate", property(lambda self: False))
    client = await make_client()
    for body in (
        chat(messages=[]),
        chat(messages=[], stream=True, tools=[TOOL], n=3),
        chat(ASSISTANT, max_tokens=1),
    ):
        assert_error(await post(client, CHAT, body), 405, detail("Not allowed"))


async def test_e6_score_without_texts(client):
    reply = await post(client, SCORE, {"model": "m", "messages": []})
    assert_error(reply, 400, detail("Invalid request"))


@pytest.fixture
def media_files(tmp_path: Path) -> dict[str, Path]:
    """Files around a safe media folder `safe_media`, by name."""
    safe = tmp_path / "safe_media"
    files = {
        "inside": safe / "cat.png",
        "nested": safe / "a" / "b" / "cat.png",
        "outside": tmp_path / "elsewhere" / "dog.png",
        "sibling": tmp_path / "safe_media_x" / "dog.png",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x89PNG\r\n\x1a\n")
    files["symlink-out"] = safe / "link.png"
    files["symlink-out"].symlink_to(files["outside"])
    files["dotdot"] = Path(f"{safe}/../elsewhere/dog.png")
    return files


E7 = "Local file access is disabled."
E8 = "Invalid or inaccessible file path."
TEXT_ONLY = (
    "messages[0].content[1] is {}, but this server's model takes text only; start it with "
    "--mmproj PROJECTOR.gguf (the model's multimodal projector) to send {}, or send text "
    "content only."
)

LOCAL_FILE_CASES = [
    # (ALLOW_LOCAL_FILES or None for unset, SAFE_MEDIA_PATH exists, file, kind, status, detail)
    pytest.param("0", True, "inside", "image_url", 403, E7, id="E7-0"),
    pytest.param("false", True, "outside", "video_url", 403, E7, id="E7-false"),
    pytest.param("yes", True, "inside", "audio_url", 403, E7, id="E7-yes-is-not-enabled"),
    pytest.param("on", True, "outside", "image_url", 403, E7, id="E7-on-is-not-enabled"),
    pytest.param("", True, "inside", "image_url", 403, E7, id="E7-empty"),
    pytest.param("1", True, "outside", "image_url", 400, E8, id="E8"),
    pytest.param(None, True, "outside", "image_url", 400, E8, id="E8-enabled-by-default"),
    pytest.param("TRUE", True, "outside", "audio_url", 400, E8, id="E8-TRUE"),
    pytest.param("y", True, "symlink-out", "image_url", 400, E8, id="E8-symlink-out"),
    pytest.param("1", True, "dotdot", "video_url", 400, E8, id="E8-dotdot"),
    pytest.param("1", False, "inside", "image_url", 400, E8, id="E8-no-safe-folder"),
    # edgeserve's hardening (validation.media._check_local_file): the reference's startswith test
    # admits a sibling folder that shares the prefix; edgeserve compares path components.
    pytest.param("1", True, "sibling", "image_url", 400, E8, id="E8-prefix-sibling-hardened"),
    pytest.param(
        "y",
        True,
        "inside",
        "image_url",
        400,
        TEXT_ONLY.format("an image", "images"),
        id="inside-passes-E7-E8",
    ),
    pytest.param(
        "1",
        True,
        "nested",
        "audio_url",
        400,
        TEXT_ONLY.format("audio", "audio"),
        id="nested-passes-E7-E8",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("allow", "safe", "name", "kind", "status", "text"), LOCAL_FILE_CASES)
async def test_local_files(
    make_client, monkeypatch, media_files, allow, safe, name, kind, status, text, stream
):
    if allow is None:
        monkeypatch.delenv("ALLOW_LOCAL_FILES", raising=False)
    else:
        monkeypatch.setenv("ALLOW_LOCAL_FILES", allow)
    safe_dir = media_files["inside"].parent
    monkeypatch.setenv("SAFE_MEDIA_PATH", str(safe_dir if safe else safe_dir / "missing"))
    client = await make_client()
    reply = await post(client, CHAT, chat(media(str(media_files[name]), kind), stream=stream))
    assert_error(reply, status, detail(text))
    assert not (safe_dir / "missing").exists(), "the safe folder is never created"


async def test_e8_relative_path_of_an_existing_file(make_client, monkeypatch, media_files):
    monkeypatch.chdir(media_files["outside"].parent)
    monkeypatch.setenv("SAFE_MEDIA_PATH", str(media_files["inside"].parent))
    client = await make_client()
    reply = await post(client, CHAT, chat(media("dog.png")))
    assert_error(reply, 400, detail(E8))


async def test_a_folder_is_not_a_local_file(make_client, monkeypatch, media_files):
    # Local files enabled: disabled, any path is E7 (README divergence 21, test_divergences.py).
    monkeypatch.setenv("ALLOW_LOCAL_FILES", "1")
    client = await make_client()
    reply = await post(client, CHAT, chat(media(str(media_files["inside"].parent))))
    assert_error(reply, 400, detail(E9))


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        pytest.param(CHAT, b'{"model": "\xff"}', id="chat-invalid-utf8"),
        pytest.param(CHAT, b'{"model": "m", "messages": [], "x": "\xc3\x28"}', id="chat-bad-seq"),
        pytest.param(SCORE, b'{"model": "\xfe\xfe"}', id="score-invalid-utf8"),
        pytest.param(CHAT, b"[" * 100_000, id="nesting-too-deep"),
        pytest.param(CHAT, b'{"n": ' + b"9" * 5000 + b"}", id="int-too-long"),
    ],
)
async def test_e14_unparsable_body(client, path, raw):
    reply = await send(client, "POST", path, raw=raw, ctype="application/json; charset=utf-8")
    assert_error(reply, 400, detail("There was an error parsing the body"))


def missing(*loc: object, given: object) -> dict[str, object]:
    return {"type": "missing", "loc": ["body", *loc], "msg": "Field required", "input": given}


def string_type(*loc: object, given: object) -> dict[str, object]:
    return {
        "type": "string_type",
        "loc": ["body", *loc],
        "msg": "Input should be a valid string",
        "input": given,
    }


def list_type(*loc: object, given: object) -> dict[str, object]:
    return {
        "type": "list_type",
        "loc": ["body", *loc],
        "msg": "Input should be a valid list",
        "input": given,
    }


def attributes_type(given: object) -> dict[str, object]:
    return {
        "type": "model_attributes_type",
        "loc": ["body"],
        "msg": "Input should be a valid dictionary or object to extract fields from",
        "input": given,
    }


def literal(loc: list[object], given: object, expected: str) -> dict[str, object]:
    return {
        "type": "literal_error",
        "loc": ["body", *loc],
        "msg": f"Input should be {expected}",
        "input": given,
        "ctx": {"expected": expected},
    }


ROLES = "'user', 'assistant', 'system', 'function' or 'tool'"
ITEM_TYPES = "'text', 'image_url', 'video_url' or 'audio_url'"
ITEM = "list[MultimodalInputItem]"
AUDIO_ITEM = [{"type": "input_audio", "input_audio": {}}]
ULTRA = [{"type": "image_url", "image_url": {"url": "http://x/y.png", "detail": "ultra"}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CALL_NO_ID = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
CALL_OBJ_ARGS = {"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}
TOOL_NO_PARAMETERS = {"type": "function", "function": {"name": "f", "description": "d"}}


def calling(call: dict[str, object]) -> dict[str, object]:
    return chat(USER, {"role": "assistant", "content": None, "tool_calls": [call]}, USER)


# (path, raw body, content type, every 422 item); reference-api.md §4, in its order.
VALIDATION_422 = [
    pytest.param(
        CHAT,
        b'{"model": "m", "messages": [',
        JSON,
        [
            {
                "type": "json_invalid",
                "loc": ["body", 28],
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": "Expecting value"},
            }
        ],
        id="json-invalid-truncated",
    ),
    pytest.param(
        CHAT,
        b"{bad",
        JSON,
        [
            {
                "type": "json_invalid",
                "loc": ["body", 1],
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": "Expecting property name enclosed in double quotes"},
            }
        ],
        id="json-invalid-bad-key",
    ),
    pytest.param(CHAT, b"", JSON, [missing(given=None)], id="empty-body"),
    pytest.param(SCORE, b"", "application/json", [missing(given=None)], id="score-empty-body"),
    pytest.param(CHAT, b"[]", JSON, [attributes_type([])], id="json-list"),
    pytest.param(CHAT, b"null", JSON, [attributes_type(None)], id="json-null"),
    pytest.param(CHAT, b'{"a": 1}', "text/plain", [attributes_type('{"a": 1}')], id="text-plain"),
    pytest.param(CHAT, b'{"model": "m"}', None, [attributes_type('{"model": "m"}')], id="no-ctype"),
    pytest.param(
        CHAT,
        b'{"model": "m"}',
        "application/vnd.api+json; charset=utf-8",
        [missing("messages", given={"model": "m"})],
        id="plus-json-ctype",
    ),
    pytest.param(
        CHAT,
        b'{"messages": [{"role": "user", "content": "hi"}]}',
        JSON,
        [missing("model", given={"messages": [{"role": "user", "content": "hi"}]})],
        id="missing-model",
    ),
    pytest.param(
        CHAT, b"{}", JSON, [missing("model", given={}), missing("messages", given={})], id="{}"
    ),
    pytest.param(
        CHAT,
        b'{"model": "m", "messages": "hi"}',
        JSON,
        [list_type("messages", given="hi")],
        id="messages-str",
    ),
    pytest.param(
        CHAT,
        chat({"role": "developer", "content": "x"}),
        JSON,
        [
            {
                "type": "enum",
                "loc": ["body", "messages", 0, "role"],
                "msg": f"Input should be {ROLES}",
                "input": "developer",
                "ctx": {"expected": ROLES},
            }
        ],
        id="role-developer",
    ),
    pytest.param(
        CHAT,
        chat({"role": "user", "content": AUDIO_ITEM}),
        JSON,
        [
            string_type("messages", 0, "content", "str", given=AUDIO_ITEM),
            literal(["messages", 0, "content", ITEM, 0, "type"], "input_audio", ITEM_TYPES),
        ],
        id="item-input_audio",
    ),
    pytest.param(
        CHAT,
        chat({"role": "user", "content": 5}),
        JSON,
        [
            string_type("messages", 0, "content", "str", given=5),
            list_type("messages", 0, "content", ITEM, given=5),
        ],
        id="content-int",
    ),
    pytest.param(
        CHAT,
        chat(n="two"),
        JSON,
        [
            {
                "type": "int_parsing",
                "loc": ["body", "n"],
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "input": "two",
            }
        ],
        id="n-two",
    ),
    pytest.param(
        CHAT,
        chat(n=1.5),
        JSON,
        [
            {
                "type": "int_from_float",
                "loc": ["body", "n"],
                "msg": "Input should be a valid integer, got a number with a fractional part",
                "input": 1.5,
            }
        ],
        id="n-1.5",
    ),
    pytest.param(
        CHAT,
        chat(n=None),
        JSON,
        [
            {
                "type": "int_type",
                "loc": ["body", "n"],
                "msg": "Input should be a valid integer",
                "input": None,
            }
        ],
        id="n-null",
    ),
    pytest.param(
        CHAT,
        chat(stream="maybe"),
        JSON,
        [
            {
                "type": "bool_parsing",
                "loc": ["body", "stream"],
                "msg": "Input should be a valid boolean, unable to interpret input",
                "input": "maybe",
            }
        ],
        id="stream-maybe",
    ),
    pytest.param(
        CHAT,
        chat(stream=None),
        JSON,
        [
            {
                "type": "bool_type",
                "loc": ["body", "stream"],
                "msg": "Input should be a valid boolean",
                "input": None,
            }
        ],
        id="stream-null",
    ),
    pytest.param(
        CHAT,
        chat(temperature="hot"),
        JSON,
        [
            {
                "type": "float_parsing",
                "loc": ["body", "temperature"],
                "msg": "Input should be a valid number, unable to parse string as a number",
                "input": "hot",
            }
        ],
        id="temperature-hot",
    ),
    pytest.param(
        CHAT,
        chat(stop=5),
        JSON,
        [string_type("stop", "str", given=5), list_type("stop", "list[str]", given=5)],
        id="stop-int",
    ),
    pytest.param(
        CHAT, {"model": 5, "messages": [USER]}, JSON, [string_type("model", given=5)], id="model-5"
    ),
    pytest.param(
        CHAT,
        chat(tools=[TOOL_NO_PARAMETERS]),
        JSON,
        [missing("tools", 0, "function", "parameters", given={"name": "f", "description": "d"})],
        id="tool-without-parameters",
    ),
    pytest.param(
        CHAT,
        chat(tools=[{"type": "web_search"}]),
        JSON,
        [literal(["tools", 0, "type"], "web_search", "'function' or 'code_interpreter'")],
        id="tool-web_search",
    ),
    pytest.param(
        CHAT,
        calling(CALL_OBJ_ARGS),
        JSON,
        [string_type("messages", 1, "tool_calls", 0, "function", "arguments", given={"a": 1})],
        id="tool-call-object-arguments",
    ),
    pytest.param(
        CHAT,
        calling(CALL_NO_ID),
        JSON,
        [missing("messages", 1, "tool_calls", 0, "id", given=CALL_NO_ID)],
        id="tool-call-without-id",
    ),
    pytest.param(
        CHAT,
        chat({"role": "user", "content": ULTRA}),
        JSON,
        [
            string_type("messages", 0, "content", "str", given=ULTRA),
            literal(
                ["messages", 0, "content", ITEM, 0, "image_url", "detail"],
                "ultra",
                "'auto', 'low' or 'high'",
            ),
        ],
        id="image-detail-ultra",
    ),
    pytest.param(
        SCORE,
        {"model": "m", "messages": [{"role": "user"}]},
        JSON,
        [string_type("messages", 0, given={"role": "user"})],
        id="score-object-item",
    ),
    pytest.param(
        SCORE,
        {"model": "m", "messages": ["a", 7, None]},
        JSON,
        [string_type("messages", 1, given=7), string_type("messages", 2, given=None)],
        id="score-non-string-items",
    ),
    pytest.param(
        SCORE,
        {"model": "m", "messages": ["a"], "max_length": "x"},
        JSON,
        [
            {
                "type": "int_parsing",
                "loc": ["body", "max_length"],
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "input": "x",
            }
        ],
        id="score-max_length-x",
    ),
    pytest.param(
        SCORE,
        {"model": "m"},
        JSON,
        [missing("messages", given={"model": "m"})],
        id="score-missing-messages",
    ),
    pytest.param(SCORE, b"[1]", JSON, [attributes_type([1])], id="score-json-list"),
    pytest.param(SCORE, b'"text"', JSON, [attributes_type("text")], id="score-json-string"),
    pytest.param(
        CHAT,
        chat("hi"),
        JSON,
        [
            {
                "type": "model_attributes_type",
                "loc": ["body", "messages", 0],
                "msg": "Input should be a valid dictionary or object to extract fields from",
                "input": "hi",
            }
        ],
        id="message-not-an-object",
    ),
]


@pytest.mark.parametrize(("path", "body", "ctype", "items"), VALIDATION_422)
async def test_422_bodies(client, path, body, ctype, items):
    if isinstance(body, bytes):
        reply = await send(client, "POST", path, raw=body, ctype=ctype)
    else:
        reply = await post(client, path, body, ctype=ctype)
    assert_error(reply, 422, detail(items))


async def test_422_valid_tool_call_passes_schema(client):
    """The control case for the two tool_call rows: a well-formed call is not a 422."""
    reply = await post(client, CHAT, {**calling(CALL), "max_tokens": 1})
    assert reply.status == 200, reply.body
