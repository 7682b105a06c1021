"""Pydantic v2 wire models only, no behaviour."""

from edgeserve.protocol.chat import (
    URL,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamResponse,
    ChatCompletionStreamResponseChoice,
    ChatMessage,
    Finish,
    Function,
    FunctionAvailable,
    FunctionCall,
    FunctionDefinition,
    MultimodalInputItem,
    ResponseFormat,
    Role,
    StreamOptions,
)
from edgeserve.protocol.common import PromptTokensDetails, ProtocolModel, Usage
from edgeserve.protocol.completions import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from edgeserve.protocol.models import ModelCard, ModelList
from edgeserve.protocol.score import ScoreEvaluationRequest, ScoreEvaluationResponse

__all__ = [
    "URL",
    "ChatCompletionMessage",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatCompletionResponseChoice",
    "ChatCompletionStreamResponse",
    "ChatCompletionStreamResponseChoice",
    "ChatMessage",
    "CompletionChoice",
    "CompletionRequest",
    "CompletionResponse",
    "Finish",
    "Function",
    "FunctionAvailable",
    "FunctionCall",
    "FunctionDefinition",
    "ModelCard",
    "ModelList",
    "MultimodalInputItem",
    "PromptTokensDetails",
    "ProtocolModel",
    "ResponseFormat",
    "Role",
    "ScoreEvaluationRequest",
    "ScoreEvaluationResponse",
    "StreamOptions",
    "Usage",
]
