"""Ollama's routes: /api/chat and /api/generate on the one generation path (NDJSON streams),
and the table of every route (embed.py and catalogue_routes.py hold the others). Model names
are read by `names.served_name` on every route that runs a model. Errors leave as
`{"error": …}` (the HTTP layer answers every error on these paths with
`ollama_error_body`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeserve.api.common.call import Call, Route
from edgeserve.api.common.generating_api import GenerationWork, TokenUsage
from edgeserve.api.ollama.catalogue_routes import no_registry, ps, show, tags, version
from edgeserve.api.ollama.embed import embed, embeddings
from edgeserve.api.ollama.names import served_name
from edgeserve.api.ollama.render import Kind, OllamaRenderer, error_body
from edgeserve.api.ollama.translate import OllamaWork, prepare_chat, prepare_generate
from edgeserve.api.ollama.wire import ChatRequest, GenerateRequest, GenerationRequest
from edgeserve.api.reference.engine_errors import engine_error
from edgeserve.api.reference.errors import error_message
from edgeserve.api.reference.limits import Limits
from edgeserve.api.reference.request import parse_body
from edgeserve.config import values
from edgeserve.errors import ApiError, EngineError


@dataclass(frozen=True)
class OllamaGeneration(GenerationWork):
    """The engine work of a chat or generate request, and what it did instead when it ran
    nothing ("load" or "unload")."""

    idle: str | None = None


class OllamaApi:
    """/api/chat or /api/generate: Ollama's checks, one engine request (or none, when the
    request only loads or unloads its model), Ollama's objects."""

    def __init__(self, kind: Kind) -> None:
        self._kind = kind

    def parse(self, body: Any, limits: Limits) -> ChatRequest | GenerateRequest:
        """The body as Ollama's request (a schema error is Ollama's 400)."""
        return parse_body(ChatRequest if self._kind == "chat" else GenerateRequest, body)

    async def translate(
        self, req: ChatRequest | GenerateRequest, limits: Limits
    ) -> OllamaGeneration:
        """Every check, then the engine work."""
        if isinstance(req, ChatRequest):
            work: OllamaWork = await prepare_chat(req, limits)
        else:
            work = await prepare_generate(req, limits)
        if work.request is None:  # one JSON object, streamed or not, as Ollama answers it
            return OllamaGeneration((), idle=_idle_reason(req))
        return OllamaGeneration(
            (work.request,),
            stream=req.stream is not False,  # Ollama streams unless told not to
            tools=work.tools,
        )

    def admission_error(self, work: GenerationWork, exc: EngineError, position: int) -> ApiError:
        """The engine's refusal (a prompt too long, a full queue) as its error."""
        return engine_error(exc)

    async def renderer(
        self, req: GenerationRequest, work: OllamaGeneration, call: Call, usage: TokenUsage
    ) -> OllamaRenderer:
        """Ollama's objects, named as the request named the model."""
        model = req.model or call.model_name
        return OllamaRenderer(self._kind, model, call.record, usage.prompt_tokens, work.idle)


def _idle_reason(req: GenerationRequest) -> str:
    """What an empty request did: unload the model (keep_alive 0) or load it."""
    return "unload" if _unloads_now(req.keep_alive) else "load"


def _unloads_now(keep_alive: object) -> bool:
    try:
        return keep_alive is not None and values.keep_alive(keep_alive) == 0
    except ValueError:
        return False


def only_unloads(body: Any) -> bool:
    """Whether a chat or generate body only unloads its model: keep_alive 0 and nothing to
    run (no messages; no prompt and no images), which Ollama answers without loading it."""
    if not isinstance(body, dict) or any(body.get(k) for k in ("messages", "prompt", "images")):
        return False
    return _unloads_now(body.get("keep_alive"))


def ollama_error_body(err: ApiError) -> tuple[int, bytes]:
    """Any client error as Ollama answers it: `{"error": message}`, a schema error (422) as
    Ollama's 400."""
    status = 400 if err.status == 422 else err.status
    return status, error_body(error_message(err.detail))


ROUTES = (
    Route(
        "POST",
        "/api/chat",
        OllamaApi("chat"),
        names=served_name,
        streams="ndjson",
        unloads=only_unloads,
    ),
    Route(
        "POST",
        "/api/generate",
        OllamaApi("generate"),
        names=served_name,
        streams="ndjson",
        unloads=only_unloads,
    ),
    Route("POST", "/api/embed", embed, names=served_name),
    Route("POST", "/api/embeddings", embeddings, names=served_name),
    Route("GET", "/api/tags", tags, uses_model=False),
    Route("GET", "/api/ps", ps, uses_model=False),
    Route("POST", "/api/show", show, uses_model=False),
    Route("GET", "/api/version", version, uses_model=False),
    *(
        Route(method, path, no_registry(path), uses_model=False)
        for method, path in (
            ("POST", "/api/pull"),
            ("POST", "/api/push"),
            ("POST", "/api/create"),
            ("POST", "/api/copy"),
            ("DELETE", "/api/delete"),
        )
    ),
)
