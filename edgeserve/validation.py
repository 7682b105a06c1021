"""Every client-facing 4xx is decided here, and only here.

The HTTP handlers call, in the reference's order (reference-api.md section 2):

    decode_json_body      body bytes → JSON value     422 json_invalid, 400 unparsable body
    check_api_key         Authorization header        401
    parse_*_request       JSON value → wire model     422 (FastAPI's item shape)
    check_can_generate    / check_can_score           405 "Not allowed"
    prepare_chat          wire model → engine request 400/403 (reference strings, then our own)
    prepare_responses     Responses model → chat request → prepare_chat  400 (ours, then chat's)
    prepare_completion    wire model → engine requests 400 (POST /v1/completions, ours only)
    prepare_score         wire model → ScoreRequest   400
    prepare_tokenize      wire model → Tokenization   400 (POST /tokenize, ours only)
    prepare_embeddings    wire model → EmbedRequest   400 (POST /v1/embeddings, ours only)
    prepare_messages      wire model → engine request 400 (Anthropic's POST /v1/messages)
    prepare_count_tokens  wire model → ChatPrompt     400 (its /v1/messages/count_tokens)

plus engine_error (engine exceptions → 503/400; completion_engine_error,
embeddings_engine_error and token_engine_error name the prompt, input or token at fault),
body_too_large (413), not_found (404), method_not_allowed (405) and request_timeout (504,
past --request-timeout-s); anthropic_error gives the status and error type an Anthropic
endpoint answers any of them with. Reference details
are byte-exact; edgeserve's own messages (for inputs that crash the reference with a 500, for
limits and for a text-only model) say what to change. All strings live in `Detail`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.message
import hmac
import ipaddress
import json
import math
import os
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar
from urllib.parse import urlparse

from pydantic import BaseModel, ValidationError

from edgeserve import errors, grammars
from edgeserve.engine.types import (
    ChatPrompt,
    ChatTurn,
    EmbedRequest,
    GenerationRequest,
    GrammarSpec,
    SamplingParams,
    ScoreRequest,
    Tokenization,
    TokenPrompt,
)
from edgeserve.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    CountTokensRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    Function,
    FunctionAvailable,
    FunctionCall,
    FunctionDefinition,
    InputContent,
    InputItem,
    MessageParam,
    MessagesRequest,
    MultimodalInputItem,
    ResponseFormat,
    ResponsesRequest,
    ResponsesTool,
    Role,
    ScoreEvaluationRequest,
    TextBlock,
    TextConfig,
    TokenizeRequest,
    ToolResultBlock,
    ToolUseBlock,
)


class Detail:
    """Every `detail` string this module produces.

    The first block is the reference's, byte-exact; the second is edgeserve's own (str.format
    templates for the 400s that replace the reference's 500s, and for limits).
    """

    INVALID_API_KEY = "Invalid API key."
    NOT_ALLOWED = "Not allowed"
    INVALID_LENGTH = "Invalid length"
    ONLY_UAUAU = "Only supports u/a/u/a/u..."
    INVALID_ROLE = "Invalid role"
    INVALID_REQUEST = "Invalid request"
    LOCAL_FILES_DISABLED = "Local file access is disabled."
    INVALID_FILE_PATH = "Invalid or inaccessible file path."
    URL_SCHEME = "Invalid URL: 400: Only HTTP/HTTPS URLs are allowed."
    URL_HOSTNAME = "Invalid URL: 400: Invalid URL hostname."
    URL_PRIVATE = "Invalid URL: 403: Access to private or reserved IP addresses is not allowed."
    URL_UNRESOLVABLE = "Could not resolve hostname: {host}"
    URL_OTHER = "Invalid URL: {error}"
    BODY_UNPARSABLE = "There was an error parsing the body"
    CANNOT_STREAM_N = "Cannot stream multiple responses."
    NOT_FOUND = "Not Found"
    METHOD_NOT_ALLOWED = "Method Not Allowed"

    TEXT_WITHOUT_TEXT = (
        '{where} has type "text" but no "text" string; add the text or remove the item.'
    )
    MEDIA_WITHOUT_URL = (
        '{where} has type "{kind}" but no "{kind}" object; '
        'add {{"{kind}": {{"url": "..."}}}} or remove the item.'
    )
    BAD_DATA_URI = (
        "{where}.{kind}.url is a data URI whose payload is not valid base64 data; "
        "encode the file with standard base64."
    )
    MEDIA_UNSUPPORTED = (
        "This model does not accept {media} input ({where}); send text content only."
    )
    CONTENT_NULL = (
        "messages[{index}].content is null; give the message a content string "
        "(only an assistant message with tool_calls may omit it)."
    )
    TOOL_WITHOUT_FUNCTION = (
        'tools[{index}] has no "function"; give each tool a "function" object with '
        '"name" and "parameters" (and optionally "description").'
    )
    BAD_UNICODE = "{where} contains an unpaired UTF-16 surrogate; send valid Unicode text."
    NOT_POSITIVE = '"{name}" must be at least 1, got {value}.'
    OVER_LIMIT = '"{name}" is {value} but this server allows at most {limit}; lower it.'
    NOT_FINITE = '"{name}" must be a finite number, got {value}.'
    BELOW = '"{name}" must be at least {low}, got {value}.'
    NOT_ABOVE = '"{name}" must be greater than {low}, got {value}.'
    OUT_OF_RANGE = '"{name}" must be between {low} and {high}, got {value}.'
    LOGIT_BIAS_KEY = (
        '"logit_bias" keys must be token ids written as decimal integers of at most 9 digits, '
        "got {key}."
    )
    TOOL_CHOICE_INVALID = (
        '"tool_choice" must be "none", "auto", "required" or '
        '{{"type": "function", "function": {{"name": "..."}}}}, got {value}.'
    )
    TOOL_CHOICE_WITHOUT_TOOLS = (
        '"tool_choice": {value} forces a tool call but the request has no "tools"; '
        "add the functions or leave tool_choice out."
    )
    TOOL_CHOICE_UNKNOWN_FUNCTION = (
        '"tool_choice" names the function {name}, which is not in "tools" ({known}); '
        "name one of those."
    )
    SUFFIX_UNSUPPORTED = (
        '"suffix" is not supported (this server does no fill-in-the-middle); '
        "leave it out or send null."
    )
    BEST_OF_UNSUPPORTED = (
        '"best_of" is not supported; leave it out or set it equal to "n" ({n}), got {value}.'
    )
    EMPTY_PROMPT_LIST = (
        '"prompt" is an empty list; send a string, a list of strings, a list of token ids or '
        "a list of token-id lists."
    )
    EMPTY_TOKEN_PROMPT = '"{where}" is an empty list of token ids; send at least one token id.'
    UNKNOWN_TOKEN = (
        '"{where}" is the token id {token}, which is not in the vocabulary of this model '
        "(ids 0 to {last}); send ids from its tokenizer (POST /tokenize)."
    )
    TOKENIZE_NO_TEXT = (
        'The request has no text to tokenize; send {"prompt": "..."} '
        '(or llama-server\'s {"content": "..."}).'
    )
    TOKENIZE_TWO_TEXTS = (
        'The request has both "prompt" and "content"; send the text in one of them.'
    )
    TOO_MANY_CHOICES = (
        '"prompt" has {prompts} prompts and "n" is {n}: {total} choices, but this server '
        "allows at most {limit} per request; send fewer prompts or lower n."
    )
    COMPLETION_PROMPT_TOO_LONG = (
        "{where} is {n_prompt} tokens but the context window is {n_ctx} tokens; shorten it "
        "(it must leave room for at least one new token)."
    )
    JSON_SCHEMA_MISSING = (
        '"response_format" has type "json_schema" but no "json_schema"; add the schema object.'
    )
    JSON_SCHEMA_WITHOUT_SCHEMA = (
        '"response_format.json_schema" has no "schema" object; put the JSON schema of the '
        'answer there, or use {"type": "json_object"} for any JSON object.'
    )
    JSON_SCHEMA_UNUSABLE = (
        '"response_format.json_schema.schema" cannot be turned into a grammar: {error}; '
        'simplify the schema, or use {{"type": "json_object"}}.'
    )
    TOP_LOGPROBS_WITHOUT_LOGPROBS = (
        '"top_logprobs" requires "logprobs": true; set it or leave top_logprobs out.'
    )
    TOO_MANY_TEXTS = (
        '"messages" has {count} texts but this server scores at most {limit} per request; '
        "split the request."
    )
    EMPTY_INPUT_LIST = '"input" is an empty list; send at least one text or list of token ids.'
    EMPTY_TOKEN_INPUT = '"{where}" is an empty list of token ids; send at least one token.'
    TOO_MANY_INPUTS = (
        '"input" has {count} items but this server embeds at most {limit} per request; '
        "split the request."
    )
    DIMENSIONS_UNSUPPORTED = (
        '"dimensions" is {value} but this model\'s embeddings have {size} dimensions and '
        "cannot be shortened (its vectors were not trained to be cut); leave it out or send "
        "{size}."
    )
    EMBED_INPUT_TOO_LONG = (
        '"{where}" is {n_prompt} tokens but this server embeds at most {n_ctx} tokens per '
        "input; shorten it or split it."
    )
    MESSAGES_EMPTY = '"messages" is empty; send at least one user message.'
    MESSAGES_FIRST_NOT_USER = (
        'messages[0] has role "assistant"; the conversation must start with a user message.'
    )
    MESSAGES_PREFILL = (
        'The last message has role "assistant": this server does not continue a prefilled '
        "answer; end the conversation with a user message."
    )
    MESSAGE_EMPTY = "messages[{index}] has no content; every message needs some text."
    MESSAGE_BLOCK_UNSUPPORTED = (
        'messages[{index}].content[{number}] is a "{kind}" block, which this server does not '
        "take (the model reads text only); send text, tool_use and tool_result blocks."
    )
    MESSAGE_BLOCK_WRONG_ROLE = (
        'messages[{index}].content[{number}] is a "{kind}" block in a message of role "{role}"; '
        "tool_use blocks belong in assistant messages, tool_result blocks in user messages."
    )
    TOOL_RESULT_UNKNOWN_ID = (
        "messages[{index}].content[{number}] answers tool_use_id {id}, which no tool_use block "
        "of the previous assistant message has; give the id of the call it answers."
    )
    TOOL_CHOICE_NEEDS_NAME = (
        '"tool_choice" has type "tool" but no "name"; name the tool the answer must use.'
    )
    MESSAGES_TOOL_CHOICE_WITHOUT_TOOLS = (
        '"tool_choice" has type {value} but the request has no "tools"; add the tools or '
        "leave tool_choice out."
    )
    MESSAGES_TOOL_UNKNOWN = (
        '"tool_choice" names the tool {name}, which is not in "tools" ({known}); name one of those.'
    )
    SERVER_BUSY = "Server is busy: the request queue is full; retry later."
    SHUTTING_DOWN = (
        "Server is shutting down and accepts no new requests; retry once it is back "
        "or on another instance."
    )
    PROMPT_TOO_LONG = (
        "The prompt is {n_prompt} tokens but the context window is {n_ctx} tokens; "
        "shorten the messages (it must leave room for at least one new token)."
    )
    TEXT_TOO_LONG = (
        "Text {index} (messages[{index}]) is {n_prompt} tokens but the context window is "
        "{n_ctx} tokens; shorten it or set max_length."
    )
    REQUEST_TOO_LARGE = "{what}: {got} exceeds this server's limit of {limit}; lower it."
    BODY_TOO_LARGE = (
        "The request body is larger than this server's limit of {limit} bytes; "
        "send a smaller request."
    )
    REQUEST_TIMEOUT = (
        "The request ran longer than this server's limit of {seconds:g} seconds and was "
        "stopped; lower max_tokens, or retry when the server is less busy."
    )
    STATELESS = (
        '"{field}" is not supported: this server is stateless and keeps no responses; '
        'send the whole conversation in "input" and leave {field} out.'
    )
    ITEM_UNSUPPORTED = (
        'input[{index}] has type "{type}", which this server does not support; send '
        '"message", "function_call" or "function_call_output" items.'
    )
    PART_UNSUPPORTED = (
        'input[{index}].content[{part}] has type "{type}", which this server does not '
        'support; send "input_text" (or "output_text") parts.'
    )
    ROLE_UNSUPPORTED = (
        'input[{index}] has role {role}; send "user", "assistant", "system" or "developer".'
    )
    SYSTEM_NOT_FIRST = (
        "input[{index}] is a {role} message after the conversation started; put system and "
        'developer messages first (or use "instructions").'
    )
    ITEM_MISSING_FIELD = 'input[{index}] ({type}) has no "{field}"; add it.'
    TOOL_UNSUPPORTED = 'tools[{index}] has type "{type}"; this server only calls "function" tools.'
    TOOL_WITHOUT_NAME = 'tools[{index}] has no "name"; give each function tool a name.'
    RESPONSES_TOOL_CHOICE_INVALID = (
        '"tool_choice" must be "none", "auto", "required" or '
        '{{"type": "function", "name": "..."}}, got {value}.'
    )
    TEXT_FORMAT_WITHOUT_SCHEMA = (
        '"text.format" has type "json_schema" but no "schema" object; put the JSON schema of '
        'the answer there, or use {"type": "json_object"} for any JSON object.'
    )
    ENGINE_FAILED = "Internal Server Error"
    ENGINE_RESTARTED = (
        "The server's engine restarted after an internal error while running this request; "
        "retry it."
    )


class _EmptyBody:
    """The body of a request that sent no bytes (distinct from a JSON `null` body)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EMPTY_BODY"


EMPTY_BODY: Final = _EmptyBody()
"""What decode_json_body returns for an empty body; parse_* turn it into 422 `missing`."""

_MISSING_BODY_ITEM: Final = {
    "type": "missing",
    "loc": ["body"],
    "msg": "Field required",
    "input": None,
}

_DATA_URI: Final = {
    "image_url": re.compile(r"^data:image\/(png|jpg|jpeg|gif|bmp);base64,(.+)$"),
    "video_url": re.compile(r"^data:video\/(mp4|mkv|avi|mov);base64,(.+)$"),
    "audio_url": re.compile(r"^data:audio\/(mpeg|mp3|wav|ogg);base64,(.+)$"),
}
_MEDIA_NAME: Final = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
_TOKEN_ID: Final = re.compile(r"[0-9]{1,9}")
_LOGIT_BIAS_BOUND: Final = 100.0
_INT32_MAX: Final = 2**31 - 1
_MAX_ECHO_DEPTH: Final = 100
MAX_TOP_LOGPROBS: Final = 20
"""The most alternatives per token: chat's top_logprobs (OpenAI's limit) and the legacy
completions' logprobs (OpenAI allows 5 there)."""

_Model = TypeVar("_Model", bound=BaseModel)


def is_env_enabled(environ: Mapping[str, str], key: str, default: str = "0") -> bool:
    """The reference's boolean env parsing: enabled iff the value is true, y or 1 (any case)."""
    return environ.get(key, default).lower() in ("true", "y", "1")


def default_safe_media_path(environ: Mapping[str, str]) -> str:
    """$XDG_CACHE_HOME/edgeserve/safe_media, else ~/.cache/edgeserve/safe_media."""
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(cache, "edgeserve", "safe_media"))


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What this server accepts in one request.

    max_tokens caps max_tokens/max_completion_tokens (None: only the context window limits it).
    allow_local_files/safe_media_path/placeholders follow the reference's env variables; see
    from_env. The accepts_* flags say which media the model takes (default: text only).
    """

    max_n: int = 16
    max_tokens: int | None = None
    allow_local_files: bool = True
    safe_media_path: str = field(default_factory=lambda: default_safe_media_path(os.environ))
    accepts_images: bool = False
    accepts_video: bool = False
    accepts_audio: bool = False
    max_score_texts: int = 256
    max_embed_inputs: int = 2048  # OpenAI's own limit
    image_placeholder: str = "<image>"
    video_placeholder: str = "<video>"
    audio_placeholder: str = "<audio>"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        """Read ALLOW_LOCAL_FILES (default enabled), SAFE_MEDIA_PATH and the *_PLACEHOLDER names.

        An unset or empty SAFE_MEDIA_PATH means default_safe_media_path(environ). The folder is
        never created here. Other fields keep their defaults; use dataclasses.replace for them.
        """
        return cls(
            allow_local_files=is_env_enabled(environ, "ALLOW_LOCAL_FILES", "1"),
            safe_media_path=os.path.abspath(
                environ.get("SAFE_MEDIA_PATH") or default_safe_media_path(environ)
            ),
            image_placeholder=environ.get("IMAGE_PLACEHOLDER", "<image>"),
            video_placeholder=environ.get("VIDEO_PLACEHOLDER", "<video>"),
            audio_placeholder=environ.get("AUDIO_PLACEHOLDER", "<audio>"),
        )

    def accepts(self, kind: str) -> bool:
        """Whether the model takes media items of `kind` (image_url, video_url, audio_url)."""
        return {
            "image_url": self.accepts_images,
            "video_url": self.accepts_video,
            "audio_url": self.accepts_audio,
        }[kind]

    def placeholder(self, kind: str) -> str:
        """The text that stands for one media item of `kind` in the flattened content."""
        return {
            "image_url": self.image_placeholder,
            "video_url": self.video_placeholder,
            "audio_url": self.audio_placeholder,
        }[kind]


def _bad(detail: str) -> errors.ApiError:
    return errors.ApiError(400, detail)


def decode_json_body(raw: bytes, content_type: str | None) -> Any:
    """Decode a request body as FastAPI does before auth and validation.

    Empty → EMPTY_BODY. A JSON content type (application/json, application/*+json, parameters
    allowed) → json.loads, raising 422 json_invalid or 400 for undecodable bytes. Anything else,
    including no content type → the raw body as a str (invalid UTF-8 replaced), which schema
    validation then rejects with 422 model_attributes_type.
    """
    if not raw:
        return EMPTY_BODY
    if not _is_json_content_type(content_type):
        return raw.decode("utf-8", errors="replace")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        item = {
            "type": "json_invalid",
            "loc": ["body", exc.pos],
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise errors.ApiError(422, [item]) from exc
    except (ValueError, RecursionError) as exc:
        raise _bad(Detail.BODY_UNPARSABLE) from exc


def _is_json_content_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def check_api_key(
    authorization: str | None, keys: Sequence[str], x_api_key: str | None = None
) -> None:
    """401 unless the bearer credentials, or the `x-api-key` header's value (Anthropic's way),
    equal one of `keys`; no-op when no key is configured.

    The Authorization header is split at its first space; the scheme is case-insensitive and
    the credentials are stripped. Every key is compared in constant time. Empty keys are
    ignored (an empty API_KEY disables auth, as in the reference); a bare str is taken as one
    key.
    """
    active = [key for key in ((keys,) if isinstance(keys, str) else keys) if key]
    if not active:
        return
    given = [
        text.encode("utf-8", "surrogatepass")
        for text in (_bearer_credentials(authorization), x_api_key and x_api_key.strip())
        if text
    ]
    matches = [
        hmac.compare_digest(credentials, key.encode("utf-8", "surrogatepass"))
        for credentials in given
        for key in active
    ]
    if not any(matches):
        raise errors.ApiError(401, Detail.INVALID_API_KEY)


def _bearer_credentials(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if not scheme or not credentials or scheme.lower() != "bearer":
        return None
    return credentials


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded body against the chat schema; 422 with every error, FastAPI-shaped."""
    return _parse(ChatCompletionRequest, body)


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a decoded body against the Responses schema; 422, FastAPI-shaped."""
    return _parse(ResponsesRequest, body)


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a decoded body against the legacy completion schema; 422, FastAPI-shaped."""
    return _parse(CompletionRequest, body)


def parse_score_request(body: Any) -> ScoreEvaluationRequest:
    """Validate a decoded body against the score schema; 422 with every error, FastAPI-shaped."""
    return _parse(ScoreEvaluationRequest, body)


def parse_embedding_request(body: Any) -> EmbeddingRequest:
    """Validate a decoded body against the embeddings schema; 422, FastAPI-shaped."""
    return _parse(EmbeddingRequest, body)


def parse_tokenize_request(body: Any) -> TokenizeRequest:
    """Validate a decoded body against the /tokenize schema; 422, FastAPI-shaped."""
    return _parse(TokenizeRequest, body)


def parse_detokenize_request(body: Any) -> DetokenizeRequest:
    """Validate a decoded body against the /detokenize schema; 422, FastAPI-shaped."""
    return _parse(DetokenizeRequest, body)


def _parse(model: type[_Model], body: Any) -> _Model:
    if body is EMPTY_BODY:
        raise errors.ApiError(422, [dict(_MISSING_BODY_ITEM)])
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        items = [_error_item(error) for error in exc.errors(include_url=False)]
        raise errors.ApiError(422, items) from None


def _error_item(error: Mapping[str, Any]) -> dict[str, Any]:
    item = {
        "type": error["type"],
        "loc": ["body", *error["loc"]],
        "msg": error["msg"],
        "input": _json_safe(error["input"]),
    }
    if "ctx" in error:
        item["ctx"] = _json_safe(error["ctx"])
    return item


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Make a 422 value JSON-encodable: non-finite floats → null, unknown objects → str, and
    containers nested deeper than _MAX_ECHO_DEPTH → "..." (so echoing an absurdly deep input
    cannot exhaust the recursion limit)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, dict | list | tuple) and depth >= _MAX_ECHO_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {str(key): _json_safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item, depth + 1) for item in value]
    return str(value)


def check_can_generate(can_generate: bool) -> None:
    """405 "Not allowed" for chat on a model that cannot generate."""
    if not can_generate:
        raise errors.ApiError(405, Detail.NOT_ALLOWED)


def check_can_score(can_score: bool) -> None:
    """405 "Not allowed" for scoring on a model that cannot score (divergence 3: generative
    models can)."""
    if not can_score:
        raise errors.ApiError(405, Detail.NOT_ALLOWED)


async def prepare_chat(req: ChatCompletionRequest, limits: Limits) -> GenerationRequest:
    """Run every chat check in the reference's order and build the engine request.

    Order: Invalid length; system pop; Only supports u/a/u/a/u...; per message the role check
    then content processing (media checks E7–E13); tools; if streaming, "Cannot stream multiple
    responses." (tools stream, README divergence 10: the reference's "Cannot stream function
    calls." is never sent); then edgeserve's own checks, which replace
    errors the reference only hits in its engine (null content, media for a text-only model),
    then tool_choice, sampling values and limits (logprobs included), response_format, invalid
    Unicode and last the output grammar (a forced tool call or the response format).

    ChatTurn roles are the OpenAI names user/assistant/tool/function: "tool" is a tool result
    (the reference's "observation"), and "function" is the assistant's own tool calls, with the
    content `[{"name": ..., "arguments": "<json string>"}, ...]` (reference section 5.3).
    """
    messages = list(req.messages)
    if not messages:
        raise _bad(Detail.INVALID_LENGTH)
    system: str | None = None
    offset = 0
    if messages[0].role is Role.SYSTEM:
        system = _system_prompt(messages.pop(0))
        offset = 1
    if len(messages) % 2 == 0:
        raise _bad(Detail.ONLY_UAUAU)
    late: list[str] = []
    turns = []
    for position, message in enumerate(messages):
        _check_role(position, message.role)
        turns.append(await _turn(message, position + offset, limits, late))
    tools = _serialize_tools(req.tools)
    if req.stream and req.n > 1:
        raise _bad(Detail.CANNOT_STREAM_N)
    if late:
        raise _bad(late[0])
    forced = _forced_functions(req)
    params = _sampling_params(req, limits)
    schema = _response_schema(req.response_format)
    _check_unicode(
        [
            ("model", req.model),
            ("the system message", system),
            *((f"messages[{i + offset}]", turn.content) for i, turn in enumerate(turns)),
            ("tools", tools),
            *(("stop", text) for text in params.stop),
        ]
    )
    grammar = None
    if forced or _format_kind(req) != "text":
        grammar = await asyncio.to_thread(_grammar, req, forced, schema)
    prompt = ChatPrompt(messages=tuple(turns), system=system, tools=tools)
    return GenerationRequest(prompt=prompt, params=replace(params, grammar=grammar), n=req.n)


@dataclass(frozen=True)
class ResponsesWork:
    """A Responses request as chat sees it (`chat`, which also says whether the answer is read
    for tool calls) and the engine request built from it."""

    chat: ChatCompletionRequest
    generation: GenerationRequest


async def prepare_responses(req: ResponsesRequest, limits: Limits) -> ResponsesWork:
    """Responses' own checks, in field order (stateless fields, max_output_tokens, input items,
    tools, tool_choice, text.format), then every chat check on the translated request."""
    for name, value in (
        ("previous_response_id", req.previous_response_id is not None),
        ("store", req.store),
        ("background", req.background),
    ):
        if value:
            raise _bad(Detail.STATELESS.format(field=name))
    _check_max_tokens("max_output_tokens", req.max_output_tokens, limits)
    chat = ChatCompletionRequest(
        model=req.model,
        messages=_chat_messages(req),
        tools=_chat_tools(req.tools),
        tool_choice=_chat_tool_choice(req.tool_choice),
        response_format=_chat_format(req.text),
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=req.max_output_tokens,
        stream=req.stream,
        user=req.user,
    )
    return ResponsesWork(chat=chat, generation=await prepare_chat(chat, limits))


def _chat_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """`instructions`, then `input` as chat messages: leading system/developer messages join
    the instructions in one system message, consecutive user (or assistant) messages join in
    one, consecutive function_call items become one assistant message with tool_calls, and
    consecutive function_call_output items one tool message (texts blank-line separated, in
    input order: the outputs of parallel calls follow the calls' order)."""
    system = [] if req.instructions is None else [req.instructions]
    items = [InputItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    messages: list[ChatMessage] = []
    for index, item in enumerate(items):
        if item.type == "message":
            if item.role in ("system", "developer"):
                if messages:
                    raise _bad(Detail.SYSTEM_NOT_FIRST.format(index=index, role=item.role))
                system.append(_item_text(item.content, index, item.type, "content"))
            elif item.role in ("user", "assistant"):
                _add_text(
                    messages, Role(item.role), _item_text(item.content, index, item.type, "content")
                )
            else:
                role = json.dumps(item.role, ensure_ascii=False)
                raise _bad(Detail.ROLE_UNSUPPORTED.format(index=index, role=role))
        elif item.type == "function_call":
            function = Function(
                name=_item_field(item.name, index, item.type, "name"),
                arguments=_item_field(item.arguments, index, item.type, "arguments"),
            )
            call = FunctionCall(
                id=_item_field(item.call_id, index, item.type, "call_id"), function=function
            )
            if messages and messages[-1].role is Role.ASSISTANT:
                messages[-1].tool_calls = [*(messages[-1].tool_calls or ()), call]
            else:
                messages.append(ChatMessage(role=Role.ASSISTANT, tool_calls=[call]))
        elif item.type == "function_call_output":
            _item_field(item.call_id, index, item.type, "call_id")
            _add_text(messages, Role.TOOL, _item_text(item.output, index, item.type, "output"))
        else:
            raise _bad(Detail.ITEM_UNSUPPORTED.format(index=index, type=item.type))
    if system:
        messages.insert(0, ChatMessage(role=Role.SYSTEM, content="\n\n".join(system)))
    return messages


def _add_text(messages: list[ChatMessage], role: Role, text: str) -> None:
    """A new turn, or `text` joined to the last turn when that has the same role and no calls."""
    last = messages[-1] if messages else None
    if last is not None and last.role is role and not last.tool_calls:
        last.content = f"{last.content}\n\n{text}"
    else:
        messages.append(ChatMessage(role=role, content=text))


def _item_field(value: str | None, index: int, kind: str, name: str) -> str:
    if value is None:
        raise _bad(Detail.ITEM_MISSING_FIELD.format(index=index, type=kind, field=name))
    return value


def _item_text(content: str | list[InputContent] | None, index: int, kind: str, name: str) -> str:
    """A message's content or a function output (field `name` of a `kind` item) as one text;
    400 when it is absent or has parts other than text."""
    if content is None:
        raise _bad(Detail.ITEM_MISSING_FIELD.format(index=index, type=kind, field=name))
    if isinstance(content, str):
        return content
    texts = []
    for number, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text"):
            raise _bad(Detail.PART_UNSUPPORTED.format(index=index, part=number, type=part.type))
        if part.text is None:
            where = f"input[{index}].{name}[{number}]"
            raise _bad(Detail.TEXT_WITHOUT_TEXT.format(where=where))
        texts.append(part.text)
    return "".join(texts)


def _chat_tools(tools: list[ResponsesTool] | None) -> list[FunctionAvailable] | None:
    """Function tools in chat's nested shape; a tool without parameters takes none."""
    if tools is None:
        return None
    result = []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            raise _bad(Detail.TOOL_UNSUPPORTED.format(index=index, type=tool.type))
        if not tool.name:
            raise _bad(Detail.TOOL_WITHOUT_NAME.format(index=index))
        fields: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
        if tool.parameters is None:
            fields["parameters"] = {"type": "object", "properties": {}}
        if tool.description is not None:
            fields["description"] = tool.description
        result.append(FunctionAvailable(function=FunctionDefinition(**fields)))
    return result


def _chat_tool_choice(choice: Any) -> Any:
    """Responses' `{"type": "function", "name": ...}` in chat's nested shape; the strings as
    they are."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    value = json.dumps(choice, ensure_ascii=False)
    raise _bad(Detail.RESPONSES_TOOL_CHOICE_INVALID.format(value=value))


def _chat_format(text: TextConfig | None) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    if text is None or text.format.type == "text":
        return None
    if text.format.type == "json_object":
        return ResponseFormat(type="json_object")
    if text.format.json_schema is None:
        raise _bad(Detail.TEXT_FORMAT_WITHOUT_SCHEMA)
    schema = {"name": text.format.name, "schema": text.format.json_schema}
    return ResponseFormat(type="json_schema", json_schema=schema)


def tool_calls_wanted(req: ChatCompletionRequest) -> bool:
    """Whether the answer is parsed for tool calls: the request has tools and `tool_choice` is
    not "none" (the tools are still shown to the model then, as OpenAI does)."""
    return bool(req.tools) and req.tool_choice != "none"


def _forced_functions(req: ChatCompletionRequest) -> list[FunctionDefinition] | None:
    """The functions `tool_choice` forces the answer to call one of: all of them for
    "required", one for a named function; None when no call is forced (absent, "none",
    "auto"). 400 for a malformed value, a forced call without tools or an unknown name."""
    choice = req.tool_choice
    if choice is None or choice in ("none", "auto"):
        return None
    value = json.dumps(choice, ensure_ascii=False)
    named = (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    )
    if choice != "required" and not named:
        raise _bad(Detail.TOOL_CHOICE_INVALID.format(value=value))
    functions = _functions(req)
    if not functions:
        raise _bad(Detail.TOOL_CHOICE_WITHOUT_TOOLS.format(value=value))
    if not named:
        return functions
    name = choice["function"]["name"]
    chosen = [function for function in functions if function.name == name]
    if not chosen:
        known = ", ".join(json.dumps(f.name, ensure_ascii=False) for f in functions)
        raise _bad(
            Detail.TOOL_CHOICE_UNKNOWN_FUNCTION.format(
                name=json.dumps(name, ensure_ascii=False), known=known
            )
        )
    return chosen[:1]


def _response_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema of a "json_schema" response format (None for other types); 400 when
    the schema object is missing."""
    if response_format is None or response_format.type != "json_schema":
        return None
    if not response_format.json_schema:
        raise _bad(Detail.JSON_SCHEMA_MISSING)
    schema = response_format.json_schema.get("schema")
    if not isinstance(schema, dict):
        raise _bad(Detail.JSON_SCHEMA_WITHOUT_SCHEMA)
    return schema


def _functions(req: ChatCompletionRequest) -> list[FunctionDefinition]:
    return [tool.function for tool in req.tools or () if tool.function is not None]


def _format_kind(req: ChatCompletionRequest) -> str:
    return req.response_format.type if req.response_format else "text"


def _grammar(
    req: ChatCompletionRequest,
    forced: list[FunctionDefinition] | None,
    schema: dict[str, Any] | None,
) -> GrammarSpec | None:
    """The grammar the answer must follow. A forced tool call wins over `response_format`
    (which shapes text answers; a forced call has none). With tools the model may call, the
    answer is either a call or text in the response format. Called off the event loop, since
    converting a large schema takes a while."""
    if forced:
        return GrammarSpec("gbnf", _tool_call_grammar(forced))
    if _format_kind(req) == "text":
        return None
    if schema is None:
        answer, text = GrammarSpec("json_object"), grammars.ANY_JSON_OBJECT
    else:
        try:
            text = grammars.schema_grammar(schema)
        except grammars.GrammarError as exc:
            raise _bad(Detail.JSON_SCHEMA_UNUSABLE.format(error=exc)) from exc
        _check_unicode([("response_format", text)])
        answer = GrammarSpec("gbnf", text)
    if not tool_calls_wanted(req):
        return answer
    return GrammarSpec("gbnf", grammars.either([_tool_call_grammar(_functions(req)), text]))


def _tool_call_grammar(functions: list[FunctionDefinition]) -> str:
    return grammars.tool_call_grammar([(f.name, f.parameters) for f in functions])


def _system_prompt(message: ChatMessage) -> str | None:
    content = message.content
    if isinstance(content, list):
        return content[0].text if content else ""
    return content


def _check_role(position: int, role: Role) -> None:
    allowed = (Role.USER, Role.TOOL) if position % 2 == 0 else (Role.ASSISTANT, Role.FUNCTION)
    if role not in allowed:
        raise _bad(Detail.INVALID_ROLE)


async def _turn(message: ChatMessage, index: int, limits: Limits, late: list[str]) -> ChatTurn:
    """One message as the template sees it; errors the reference reports later go to `late`."""
    if message.role is Role.ASSISTANT and message.tool_calls:
        calls = [
            {"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls
        ]
        return ChatTurn(role=Role.FUNCTION.value, content=json.dumps(calls, ensure_ascii=False))
    content = message.content
    if isinstance(content, list):
        content = await _flatten(content, index, limits, late)
    elif content is None:
        late.append(Detail.CONTENT_NULL.format(index=index))
        content = ""
    return ChatTurn(role=message.role.value, content=content)


async def _flatten(
    items: list[MultimodalInputItem], index: int, limits: Limits, late: list[str]
) -> str:
    parts = []
    for number, item in enumerate(items):
        where = f"messages[{index}].content[{number}]"
        if item.type == "text":
            if item.text is None:
                raise _bad(Detail.TEXT_WITHOUT_TEXT.format(where=where))
            parts.append(item.text)
            continue
        url = getattr(item, item.type)
        if url is None:
            raise _bad(Detail.MEDIA_WITHOUT_URL.format(where=where, kind=item.type))
        parts.append(limits.placeholder(item.type))
        await _check_media_url(item.type, url.url, where, limits)
        if not limits.accepts(item.type):
            late.append(Detail.MEDIA_UNSUPPORTED.format(media=_MEDIA_NAME[item.type], where=where))
    return "".join(parts)


async def _check_media_url(kind: str, url: str, where: str, limits: Limits) -> None:
    """The reference's per-item order: data URI, existing local file, then remote URL."""
    if _DATA_URI[kind].match(url):
        if not _decodes_to_data(url.split(",", 1)[1]):
            raise _bad(Detail.BAD_DATA_URI.format(where=where, kind=kind))
        return
    if os.path.isfile(url):
        _check_local_file(url, limits)
        return
    await _check_remote_url(url)


def _decodes_to_data(payload: str) -> bool:
    """Whether the reference's lenient base64 decode succeeds and yields some bytes."""
    try:
        return bool(base64.b64decode(payload))
    except (binascii.Error, ValueError):
        return False


def _check_local_file(path: str, limits: Limits) -> None:
    """E7/E8. Containment is a real path-component check (the reference's plain prefix test
    also admits sibling folders such as safe_media_x); the safe folder is never created."""
    if not limits.allow_local_files:
        raise errors.ApiError(403, Detail.LOCAL_FILES_DISABLED)
    try:
        real = os.path.realpath(path)
        safe = os.path.realpath(limits.safe_media_path)
        inside = os.path.commonpath([real, safe]) == safe
    except (OSError, ValueError):
        inside = False
    if not inside:
        raise _bad(Detail.INVALID_FILE_PATH)


async def _check_remote_url(url: str) -> None:
    """E9–E13. Resolves the host on the loop's executor; never fetches the URL."""
    try:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https"):
            raise _bad(Detail.URL_SCHEME)
        hostname = parsed.hostname
        if not hostname:
            raise _bad(Detail.URL_HOSTNAME)
        port = parsed.port
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(hostname, port)
        except socket.gaierror:
            raise _bad(Detail.URL_UNRESOLVABLE.format(host=hostname)) from None
        address = ipaddress.ip_address(infos[0][4][0])
    except errors.ApiError:
        raise
    except Exception as exc:  # the reference reports any other failure as E13
        raise _bad(Detail.URL_OTHER.format(error=exc)) from exc
    if not address.is_global:
        raise _bad(Detail.URL_PRIVATE)


def _serialize_tools(tools: list[FunctionAvailable] | None) -> str | None:
    """Reference section 5.5: the functions as one JSON string; None when there are none."""
    if not tools:
        return None
    functions = []
    for index, tool in enumerate(tools):
        if tool.function is None:
            raise _bad(Detail.TOOL_WITHOUT_FUNCTION.format(index=index))
        functions.append(tool.function.model_dump(exclude_unset=True))
    return json.dumps(functions, ensure_ascii=False)


def _sampling_params(req: ChatCompletionRequest, limits: Limits) -> SamplingParams:
    """Check the sampling fields and map them; unset fields keep the engine's defaults.

    When both are given, max_completion_tokens (OpenAI's current name) wins over max_tokens.
    presence_penalty keeps its OpenAI meaning; repetition_penalty maps to repeat_penalty. As in
    the reference, n > 1 forces sampling, at temperature 1.0 when it is unset or 0. Ranges are
    OpenAI's where it has one; seed is any int64 (the engine reduces it to its own width), and
    top_k is clamped to int32 (any value past the vocabulary size means "no top-k").
    """
    token_field = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    params = _sampling(req, limits, token_field, getattr(req, token_field))
    _check_range("top_logprobs", req.top_logprobs, low=0, high=MAX_TOP_LOGPROBS)
    if req.top_logprobs is not None and not req.logprobs:
        raise _bad(Detail.TOP_LOGPROBS_WITHOUT_LOGPROBS)
    return replace(params, logprobs=(req.top_logprobs or 0) if req.logprobs else None)


def _sampling(
    req: ChatCompletionRequest | CompletionRequest,
    limits: Limits,
    token_field: str,
    max_tokens: int | None,
) -> SamplingParams:
    """The checks and mapping chat and completions share (see _sampling_params); `max_tokens`
    is the value of the field named `token_field` (None: only the context limits it)."""
    if req.n < 1:
        raise _bad(Detail.NOT_POSITIVE.format(name="n", value=req.n))
    if req.n > limits.max_n:
        raise _bad(Detail.OVER_LIMIT.format(name="n", value=req.n, limit=limits.max_n))
    _check_max_tokens(token_field, max_tokens, limits)
    _check_range("temperature", req.temperature, low=0.0)
    _check_range("top_p", req.top_p, low=0.0, high=1.0)
    _check_range("presence_penalty", req.presence_penalty, low=-2.0, high=2.0)
    _check_range("top_k", req.top_k, low=0)
    _check_range("min_p", req.min_p, low=0.0, high=1.0)
    _check_range("frequency_penalty", req.frequency_penalty, low=-2.0, high=2.0)
    _check_range("repetition_penalty", req.repetition_penalty, low=0.0, low_open=True)
    _check_range("seed", req.seed, low=-(2**63), high=2**63 - 1)
    do_sample = True if req.do_sample is None else req.do_sample
    temperature = 1.0 if req.temperature is None else req.temperature
    if req.n > 1:
        do_sample, temperature = True, temperature or 1.0
    optional = {
        "top_p": req.top_p,
        "top_k": None if req.top_k is None else min(req.top_k, _INT32_MAX),
        "min_p": req.min_p,
        "seed": req.seed,
        "repeat_penalty": req.repetition_penalty,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
    }
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        do_sample=do_sample,
        logit_bias=_logit_bias(req.logit_bias),
        stop=_stop_strings(req.stop),
        **{name: value for name, value in optional.items() if value is not None},
    )


def _check_max_tokens(name: str, value: int | None, limits: Limits) -> None:
    """400 unless the token budget in the field `name` is unset or 1 to the server's cap."""
    if value is not None and value < 1:
        raise _bad(Detail.NOT_POSITIVE.format(name=name, value=value))
    if value is not None and limits.max_tokens is not None and value > limits.max_tokens:
        raise _bad(Detail.OVER_LIMIT.format(name=name, value=value, limit=limits.max_tokens))


def _check_range(
    name: str,
    value: float | None,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(Detail.NOT_FINITE.format(name=name, value=value))
    if high is not None and not low <= value <= high:
        raise _bad(Detail.OUT_OF_RANGE.format(name=name, low=low, high=high, value=value))
    if low_open and value <= low:
        raise _bad(Detail.NOT_ABOVE.format(name=name, low=low, value=value))
    if value < low:
        raise _bad(Detail.BELOW.format(name=name, low=low, value=value))


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """Token-id strings → ints; values clamped to [-100, 100] as OpenAI does."""
    result: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not _TOKEN_ID.fullmatch(key):
            raise _bad(Detail.LOGIT_BIAS_KEY.format(key=json.dumps(key, ensure_ascii=False)))
        if not math.isfinite(value):
            raise _bad(Detail.NOT_FINITE.format(name=f"logit_bias[{key}]", value=value))
        result[int(key)] = min(max(value, -_LOGIT_BIAS_BOUND), _LOGIT_BIAS_BOUND)
    return result


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A string or list of strings → a tuple, empty strings dropped."""
    if stop is None:
        return ()
    candidates = [stop] if isinstance(stop, str) else stop
    return tuple(text for text in candidates if text)


def _check_unicode(texts: Iterable[tuple[str, str | None]]) -> None:
    """400 for text the tokenizer and the response encoder cannot take (lone surrogates)."""
    for where, text in texts:
        if text is not None and not _is_encodable(text):
            raise _bad(Detail.BAD_UNICODE.format(where=where))


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class CompletionWork:
    """What a completion request asks of the engine.

    `prompts` in request order (raw texts, or token ids used as given), `names` how messages
    name each ("prompt", or "prompt[i]" for a list); `generations` one engine request per
    prompt (none for `echo` with `max_tokens: 0`); `scoring` the prompts to score when their
    tokens are echoed with log-probabilities (or nothing is generated), else None.
    """

    prompts: tuple[str | TokenPrompt, ...]
    names: tuple[str, ...]
    generations: tuple[GenerationRequest, ...]
    scoring: ScoreRequest | None


def prepare_completion(req: CompletionRequest, limits: Limits) -> CompletionWork:
    """The legacy completion checks, and the engine work of a valid request.

    Order: an empty prompt list or token list; the OpenAI features not implemented
    (`suffix`, `best_of` other than n); the sampling checks chat has (n, max_tokens — whose
    default is OpenAI's 16, null meaning as many as fit, 0 allowed only with `echo` —,
    ranges, logit_bias, stop); `logprobs` (0 to MAX_TOP_LOGPROBS); the number of choices
    (prompts × n) against the n limit; invalid Unicode. A text prompt is raw text, tokenized
    with the model's BOS and no chat template; token ids are checked against the vocabulary
    by the engine (see completion_engine_error).
    """
    prompts, single = _completion_prompts(req.prompt)
    if not prompts:
        raise _bad(Detail.EMPTY_PROMPT_LIST)
    names = tuple(_prompt_names(len(prompts), single))
    for where, prompt in zip(names, prompts, strict=True):
        if isinstance(prompt, TokenPrompt) and not prompt.ids:
            raise _bad(Detail.EMPTY_TOKEN_PROMPT.format(where=where))
    if req.suffix:
        raise _bad(Detail.SUFFIX_UNSUPPORTED)
    if req.best_of is not None and req.best_of != req.n:
        raise _bad(Detail.BEST_OF_UNSUPPORTED.format(n=req.n, value=req.best_of))
    echo_only = req.echo and req.max_tokens == 0
    params = _sampling(req, limits, "max_tokens", None if echo_only else req.max_tokens)
    _check_range("logprobs", req.logprobs, low=0, high=MAX_TOP_LOGPROBS)
    params = replace(params, logprobs=req.logprobs)
    total = len(prompts) * req.n
    if total > limits.max_n:
        raise _bad(
            Detail.TOO_MANY_CHOICES.format(
                prompts=len(prompts), n=req.n, total=total, limit=limits.max_n
            )
        )
    texts = [(where, p) for where, p in zip(names, prompts, strict=True) if isinstance(p, str)]
    _check_unicode([("model", req.model), *texts, *(("stop", text) for text in params.stop)])
    scoring = None
    if req.echo and (req.logprobs is not None or echo_only):
        scoring = ScoreRequest(texts=prompts, top_logprobs=req.logprobs or 0)
    generations = (
        ()
        if echo_only
        else tuple(GenerationRequest(prompt=prompt, params=params, n=req.n) for prompt in prompts)
    )
    return CompletionWork(prompts, names, generations, scoring)


def _completion_prompts(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> tuple[tuple[str | TokenPrompt, ...], bool]:
    """The prompts, and whether the request sent a single one (a string or one list of token
    ids) rather than a list of them."""
    if isinstance(prompt, str):
        return (prompt,), True
    if prompt and isinstance(prompt[0], int):
        return (TokenPrompt(tuple(prompt)),), True
    return tuple(p if isinstance(p, str) else TokenPrompt(tuple(p)) for p in prompt), False


def _prompt_names(count: int, single: bool) -> list[str]:
    """How messages name each prompt: "prompt", or "prompt[i]" for a list."""
    return ["prompt"] if single else [f"prompt[{i}]" for i in range(count)]


def completion_engine_error(
    exc: errors.EngineError, names: Sequence[str], index: int | None = None
) -> errors.ApiError:
    """engine_error for a completion request whose prompts `names` names: a prompt that does
    not fit the context, or holds an unknown token id, is named as the request named it. The
    failed engine request was for prompt `index`, or (None: the echo's scoring of every
    prompt) for the one the error says."""
    if isinstance(exc, errors.PromptTooLong | errors.UnknownToken):
        position = index if exc.index is None else exc.index
        assert position is not None, "an engine error of every prompt names its prompt"
        where = names[position]
        if isinstance(exc, errors.UnknownToken):
            return token_engine_error(exc, where)
        return _bad(
            Detail.COMPLETION_PROMPT_TOO_LONG.format(
                where=f'"{where}"', n_prompt=exc.count, n_ctx=exc.n_ctx
            )
        )
    return engine_error(exc)


def token_engine_error(exc: errors.EngineError, where: str) -> errors.ApiError:
    """engine_error for a request whose token ids are the list `where` ("tokens",
    "prompt[1]"): an id outside the vocabulary is named by its position in that list."""
    if isinstance(exc, errors.UnknownToken):
        return _bad(
            Detail.UNKNOWN_TOKEN.format(
                where=f"{where}[{exc.position}]", token=exc.token, last=exc.n_vocab - 1
            )
        )
    return engine_error(exc)


def parse_messages_request(body: Any) -> MessagesRequest:
    """Validate a decoded body against Anthropic's Messages schema (422 items; an Anthropic
    endpoint answers them as 400, see anthropic_error)."""
    return _parse(MessagesRequest, body)


def parse_count_tokens_request(body: Any) -> CountTokensRequest:
    """Validate a decoded body against the count_tokens schema (as parse_messages_request)."""
    return _parse(CountTokensRequest, body)


@dataclass(frozen=True)
class MessagesPrompt:
    """A Messages request's conversation as the engine's ChatPrompt, and the tools a forced
    call may use (None when no call is forced)."""

    prompt: ChatPrompt
    forced: list[tuple[str, dict[str, Any]]] | None


def messages_calls_wanted(req: CountTokensRequest) -> bool:
    """Whether a Messages answer is read for tool calls: the request has tools and its
    tool_choice is not "none" (the tools are still shown to the model then)."""
    return bool(req.tools) and (req.tool_choice is None or req.tool_choice.type != "none")


async def prepare_messages(req: MessagesRequest, limits: Limits) -> GenerationRequest:
    """Anthropic's Messages checks and the engine request, as chat builds it.

    Order: the conversation (see messages_prompt); max_tokens (required by the schema, at
    least 1, at most the server's cap); temperature 0–1, top_p 0–1, top_k ≥ 0 (Anthropic's
    ranges); invalid Unicode; last the grammar of a forced call (tool_choice any or tool).
    """
    conversation = messages_prompt(req)
    _check_max_tokens("max_tokens", req.max_tokens, limits)
    _check_range("temperature", req.temperature, low=0.0, high=1.0)
    _check_range("top_p", req.top_p, low=0.0, high=1.0)
    _check_range("top_k", req.top_k, low=0)
    stop = _stop_strings(req.stop_sequences)
    _check_unicode(
        [
            ("model", req.model),
            *_prompt_texts(conversation.prompt),
            *(("stop_sequences", text) for text in stop),
        ]
    )
    grammar = None
    if conversation.forced:
        text = await asyncio.to_thread(grammars.tool_call_grammar, conversation.forced)
        grammar = GrammarSpec("gbnf", text)
    optional = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": None if req.top_k is None else min(req.top_k, _INT32_MAX),
    }
    params = SamplingParams(
        max_tokens=req.max_tokens,
        stop=stop,
        grammar=grammar,
        **{name: value for name, value in optional.items() if value is not None},
    )
    return GenerationRequest(prompt=conversation.prompt, params=params)


def prepare_count_tokens(req: CountTokensRequest) -> ChatPrompt:
    """The prompt whose tokens count_tokens counts, after the same checks as a Messages
    request's conversation and tools."""
    conversation = messages_prompt(req)
    _check_unicode([("model", req.model), *_prompt_texts(conversation.prompt)])
    return conversation.prompt


def _prompt_texts(prompt: ChatPrompt) -> list[tuple[str, str | None]]:
    return [
        ("system", prompt.system),
        *((f"messages[{i}]", turn.content) for i, turn in enumerate(prompt.messages)),
        ("tools", prompt.tools),
    ]


def messages_prompt(req: CountTokensRequest) -> MessagesPrompt:
    """A Messages conversation as chat's engine turns, and its tool choice.

    Consecutive messages of one role are one turn (as Anthropic merges them); the first must
    be a user's and so must the last (no prefilled answers). A user message with tool_result
    blocks is a "tool" turn: the results' text (an error result prefixed "Error: ") then any
    other text, each result answering a tool_use of the assistant turn before it. An assistant
    message with tool_use blocks is a "function" turn (chat's shape: the calls, its text left
    out). Thinking blocks are left out; image and document blocks answer 400 (text only).
    """
    if not req.messages:
        raise _bad(Detail.MESSAGES_EMPTY)
    if req.messages[0].role != "user":
        raise _bad(Detail.MESSAGES_FIRST_NOT_USER)
    if req.messages[-1].role != "user":
        raise _bad(Detail.MESSAGES_PREFILL)
    groups: list[list[tuple[int, MessageParam]]] = []
    for index, message in enumerate(req.messages):
        if groups and groups[-1][0][1].role == message.role:
            groups[-1].append((index, message))
        else:
            groups.append([(index, message)])
    turns: list[ChatTurn] = []
    calls: set[str] = set()
    for group in groups:
        turn, calls = _messages_turn(group, calls)
        turns.append(turn)
    system = req.system
    if isinstance(system, list):
        system = "\n\n".join(block.text for block in system)
    tools = None
    if req.tools:
        tools = json.dumps(
            [
                {"name": tool.name, "parameters": tool.input_schema}
                | ({} if tool.description is None else {"description": tool.description})
                for tool in req.tools
            ],
            ensure_ascii=False,
        )
    kind = "auto" if req.tool_choice is None else req.tool_choice.type
    forced = _messages_forced(req, kind) if kind in ("any", "tool") else None
    prompt = ChatPrompt(messages=tuple(turns), system=system or None, tools=tools)
    return MessagesPrompt(prompt, forced)


def _messages_turn(
    group: list[tuple[int, MessageParam]], calls: set[str]
) -> tuple[ChatTurn, set[str]]:
    """One turn from consecutive messages of one role, and the ids of its tool_use blocks;
    `calls` are the ids the assistant turn before it made."""
    role = group[0][1].role
    texts: list[str] = []
    results: list[str] = []
    uses: list[dict[str, str]] = []
    made: set[str] = set()
    for index, message in group:
        if not message.content:
            raise _bad(Detail.MESSAGE_EMPTY.format(index=index))
        blocks = (
            [TextBlock(text=message.content)]
            if isinstance(message.content, str)
            else message.content
        )
        for number, block in enumerate(blocks):
            where = {"index": index, "number": number, "kind": block.type, "role": role}
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock | ToolResultBlock):
                wrong = (role == "user") == isinstance(block, ToolUseBlock)
                if wrong:
                    raise _bad(Detail.MESSAGE_BLOCK_WRONG_ROLE.format(**where))
                if isinstance(block, ToolUseBlock):
                    made.add(block.id)
                    arguments = json.dumps(block.input, ensure_ascii=False)
                    uses.append({"name": block.name, "arguments": arguments})
                    continue
                if block.tool_use_id not in calls:
                    tool_id = json.dumps(block.tool_use_id, ensure_ascii=False)
                    raise _bad(Detail.TOOL_RESULT_UNKNOWN_ID.format(id=tool_id, **where))
                results.append(_tool_result_text(block, where))
            elif block.type in ("image", "document"):
                raise _bad(Detail.MESSAGE_BLOCK_UNSUPPORTED.format(**where))
    if uses:
        return ChatTurn(Role.FUNCTION.value, json.dumps(uses, ensure_ascii=False)), made
    if results:
        return ChatTurn(Role.TOOL.value, "\n\n".join(results + texts)), made
    if not any(texts):
        raise _bad(Detail.MESSAGE_EMPTY.format(index=group[0][0]))
    return ChatTurn(role, "\n\n".join(text for text in texts if text)), made


def _tool_result_text(block: ToolResultBlock, where: dict[str, Any]) -> str:
    """A tool result's text; only text blocks may make it up."""
    parts = []
    content = [TextBlock(text=block.content)] if isinstance(block.content, str) else block.content
    for part in content:
        if not isinstance(part, TextBlock):
            raise _bad(Detail.MESSAGE_BLOCK_UNSUPPORTED.format(**(where | {"kind": part.type})))
        parts.append(part.text)
    text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def _messages_forced(req: CountTokensRequest, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """The tools a forced call may use: all for "any", the named one for "tool"."""
    if not req.tools:
        raise _bad(Detail.MESSAGES_TOOL_CHOICE_WITHOUT_TOOLS.format(value=json.dumps(kind)))
    tools = [(tool.name, tool.input_schema) for tool in req.tools]
    if kind == "any":
        return tools
    name = req.tool_choice.name if req.tool_choice else None
    if name is None:
        raise _bad(Detail.TOOL_CHOICE_NEEDS_NAME)
    chosen = [tool for tool in tools if tool[0] == name]
    if not chosen:
        known = ", ".join(json.dumps(tool[0], ensure_ascii=False) for tool in tools)
        raise _bad(
            Detail.MESSAGES_TOOL_UNKNOWN.format(
                name=json.dumps(name, ensure_ascii=False), known=known
            )
        )
    return chosen[:1]


_ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error(err: errors.ApiError) -> tuple[int, str]:
    """The status and Anthropic error type an Anthropic endpoint answers `err` with: a schema
    error (422) is Anthropic's 400 invalid_request_error; other 4xx keep their status; any
    other status without a type of its own is api_error."""
    status = 400 if err.status == 422 else err.status
    fallback = "invalid_request_error" if 400 <= status < 500 else "api_error"
    return status, _ANTHROPIC_TYPES.get(status, fallback)


def prepare_score(req: ScoreEvaluationRequest, limits: Limits) -> ScoreRequest:
    """The score endpoint's checks: "Invalid request" for no texts, then max_length and limits."""
    if not req.messages:
        raise _bad(Detail.INVALID_REQUEST)
    if req.max_length is not None and req.max_length < 1:
        raise _bad(Detail.NOT_POSITIVE.format(name="max_length", value=req.max_length))
    if len(req.messages) > limits.max_score_texts:
        raise _bad(
            Detail.TOO_MANY_TEXTS.format(count=len(req.messages), limit=limits.max_score_texts)
        )
    _check_unicode(
        [("model", req.model), *((f"messages[{i}]", text) for i, text in enumerate(req.messages))]
    )
    return ScoreRequest(
        texts=tuple(req.messages),
        max_length=req.max_length,
        reduction=req.reduction,
        return_token_logprobs=req.return_token_logprobs,
    )


def prepare_embeddings(
    req: EmbeddingRequest, limits: Limits, size: int
) -> tuple[EmbedRequest, tuple[str, ...]]:
    """The embeddings checks, in order: an empty input list or token list, too many inputs,
    `dimensions` other than the model's `size` (its vectors cannot be cut: only models
    trained with Matryoshka losses can, and a GGUF does not say whether it was), invalid
    Unicode. Returns the engine request and how messages name each input ("input" or
    "input[i]")."""
    prompts, single = _completion_prompts(req.input)
    if not prompts:
        raise _bad(Detail.EMPTY_INPUT_LIST)
    names = ("input",) if single else tuple(f"input[{i}]" for i in range(len(prompts)))
    for where, prompt in zip(names, prompts, strict=True):
        if isinstance(prompt, TokenPrompt) and not prompt.ids:
            raise _bad(Detail.EMPTY_TOKEN_INPUT.format(where=where))
    if len(prompts) > limits.max_embed_inputs:
        raise _bad(Detail.TOO_MANY_INPUTS.format(count=len(prompts), limit=limits.max_embed_inputs))
    if req.dimensions is not None and req.dimensions != size:
        raise _bad(Detail.DIMENSIONS_UNSUPPORTED.format(value=req.dimensions, size=size))
    texts = [(where, p) for where, p in zip(names, prompts, strict=True) if isinstance(p, str)]
    _check_unicode([("model", req.model), *texts])
    return EmbedRequest(prompts), names


def embeddings_engine_error(exc: errors.EngineError, names: Sequence[str]) -> errors.ApiError:
    """engine_error for an embeddings request: an input too long for the embeddings context,
    or holding an unknown token id, is named as the request named it."""
    if isinstance(exc, errors.UnknownToken) and exc.index is not None:
        return token_engine_error(exc, names[exc.index])
    if isinstance(exc, errors.PromptTooLong) and exc.index is not None:
        return _bad(
            Detail.EMBED_INPUT_TOO_LONG.format(
                where=names[exc.index], n_prompt=exc.count, n_ctx=exc.n_ctx
            )
        )
    return engine_error(exc)


def prepare_tokenize(req: TokenizeRequest) -> Tokenization:
    """The text of a /tokenize request, in vLLM's `prompt` or llama-server's `content` (not
    both), and its options: special tokens are added as `add_special_tokens` (vLLM's name) or
    else `add_special` (llama-server's) says, by default as each server does (vLLM adds them,
    llama-server does not); the text of special tokens is read as those tokens unless
    `parse_special` is false."""
    if req.prompt is not None and req.content is not None:
        raise _bad(Detail.TOKENIZE_TWO_TEXTS)
    text = req.prompt if req.prompt is not None else req.content
    if text is None:
        raise _bad(Detail.TOKENIZE_NO_TEXT)
    _check_unicode([("model", req.model), ("prompt" if req.content is None else "content", text)])
    add_special = req.add_special_tokens
    if add_special is None:
        add_special = req.add_special if req.add_special is not None else req.prompt is not None
    return Tokenization(text, add_special=add_special, parse_special=req.parse_special)


def engine_error(exc: errors.EngineError) -> errors.ApiError:
    """The client-visible error for an engine exception (503 busy/stopping, 400 too long/large).

    An EngineError of no known kind is the server's own fault: 500.
    """
    match exc:
        case errors.EngineOverloaded():
            return errors.ApiError(503, Detail.SERVER_BUSY, {"Retry-After": "1"})
        case errors.EngineStopped():
            return errors.ApiError(503, Detail.SHUTTING_DOWN, {"Retry-After": "5"})
        case errors.EngineRestarted():
            return errors.ApiError(503, Detail.ENGINE_RESTARTED, {"Retry-After": "1"})
        case errors.PromptTooLong(index=None):
            return _bad(Detail.PROMPT_TOO_LONG.format(n_prompt=exc.count, n_ctx=exc.n_ctx))
        case errors.PromptTooLong():
            detail = Detail.TEXT_TOO_LONG.format(
                index=exc.index, n_prompt=exc.count, n_ctx=exc.n_ctx
            )
            return _bad(detail)
        case errors.InvalidPrompt():
            return _bad(str(exc))
        case errors.RequestTooLarge():
            return _bad(
                Detail.REQUEST_TOO_LARGE.format(what=exc.what, got=exc.got, limit=exc.limit)
            )
    return errors.ApiError(500, Detail.ENGINE_FAILED)


def body_too_large(limit_bytes: int) -> errors.ApiError:
    """413 for a body over the configured size limit."""
    return errors.ApiError(413, Detail.BODY_TOO_LARGE.format(limit=limit_bytes))


def request_timeout(seconds: float) -> errors.ApiError:
    """504 for a request that ran past --request-timeout-s (its engine work was cancelled)."""
    return errors.ApiError(504, Detail.REQUEST_TIMEOUT.format(seconds=seconds))


def not_found() -> errors.ApiError:
    """404 for an unknown path (E16)."""
    return errors.ApiError(404, Detail.NOT_FOUND)


def method_not_allowed(allowed: Iterable[str]) -> errors.ApiError:
    """405 for a known path with the wrong method (E17), with the Allow header."""
    return errors.ApiError(405, Detail.METHOD_NOT_ALLOWED, {"Allow": ", ".join(allowed)})


async def would_reject(
    body: Any, *, stream_checks: bool = True, limits: Limits | None = None
) -> errors.ApiError | None:
    """The error a decoded chat body would get (schema and request checks), or None.

    With stream_checks=False the body is judged as if `stream` were false.
    """
    try:
        req = parse_chat_request(body)
        if not stream_checks:
            req = req.model_copy(update={"stream": False})
        await prepare_chat(req, limits or Limits())
    except errors.ApiError as exc:
        return exc
    return None
