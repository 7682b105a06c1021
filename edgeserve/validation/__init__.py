"""Every client-facing 4xx is decided in this package, and only here.

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
body_too_large (413), host_not_allowed (403, the Host check against DNS rebinding),
not_found (404), method_not_allowed (405) and request_timeout (504, past
--request-timeout-s); anthropic_error gives the status and error type an Anthropic endpoint
answers any of them with. Reference details are byte-exact; edgeserve's own messages (for
inputs that crash the reference with a 500, for limits and for a text-only model) say what to
change. All strings live in `Detail`.

One module per API, named as in edgeserve.protocol (chat, completions, responses_api, score,
embeddings, tokenize, messages), over what they share: request (the steps before an endpoint's
own checks, and 404/405/413), sampling, media (chat's media items), engine_errors, common
(Limits, the 400 factory) and detail (`Detail`). Their public names are re-exported here.
"""

from edgeserve.validation.chat import (
    parse_chat_request,
    prepare_chat,
    tool_calls_wanted,
    would_reject,
)
from edgeserve.validation.common import Limits, default_safe_media_path, is_env_enabled
from edgeserve.validation.completions import (
    CompletionWork,
    completion_engine_error,
    parse_completion_request,
    prepare_completion,
)
from edgeserve.validation.detail import Detail
from edgeserve.validation.embeddings import (
    embeddings_engine_error,
    parse_embedding_request,
    prepare_embeddings,
)
from edgeserve.validation.engine_errors import engine_error, request_timeout, token_engine_error
from edgeserve.validation.messages import (
    MessagesPrompt,
    anthropic_error,
    messages_calls_wanted,
    messages_prompt,
    parse_count_tokens_request,
    parse_messages_request,
    prepare_count_tokens,
    prepare_messages,
)
from edgeserve.validation.request import (
    EMPTY_BODY,
    body_too_large,
    check_api_key,
    check_can_generate,
    check_can_score,
    decode_json_body,
    host_not_allowed,
    method_not_allowed,
    not_found,
)
from edgeserve.validation.responses_api import (
    ResponsesWork,
    parse_responses_request,
    prepare_responses,
)
from edgeserve.validation.sampling import MAX_TOP_LOGPROBS
from edgeserve.validation.score import parse_score_request, prepare_score
from edgeserve.validation.tokenize import (
    parse_detokenize_request,
    parse_tokenize_request,
    prepare_tokenize,
)

__all__ = [
    "EMPTY_BODY",
    "MAX_TOP_LOGPROBS",
    "CompletionWork",
    "Detail",
    "Limits",
    "MessagesPrompt",
    "ResponsesWork",
    "anthropic_error",
    "body_too_large",
    "check_api_key",
    "check_can_generate",
    "check_can_score",
    "completion_engine_error",
    "decode_json_body",
    "default_safe_media_path",
    "embeddings_engine_error",
    "engine_error",
    "host_not_allowed",
    "is_env_enabled",
    "messages_calls_wanted",
    "messages_prompt",
    "method_not_allowed",
    "not_found",
    "parse_chat_request",
    "parse_completion_request",
    "parse_count_tokens_request",
    "parse_detokenize_request",
    "parse_embedding_request",
    "parse_messages_request",
    "parse_responses_request",
    "parse_score_request",
    "parse_tokenize_request",
    "prepare_chat",
    "prepare_completion",
    "prepare_count_tokens",
    "prepare_embeddings",
    "prepare_messages",
    "prepare_responses",
    "prepare_score",
    "prepare_tokenize",
    "request_timeout",
    "token_engine_error",
    "tool_calls_wanted",
    "would_reject",
]
