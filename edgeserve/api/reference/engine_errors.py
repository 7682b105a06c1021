"""Engine exceptions as client-visible errors (engine_error, token_engine_error) and the 504 of
a request that ran past --request-timeout-s."""

from __future__ import annotations

from edgeserve import errors
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import bad


def engine_error(exc: errors.EngineError) -> errors.ApiError:
    """The client-visible error for an engine exception (503 busy/stopping, 400 too long/large,
    404 an adapter not loaded, 409 an adapter in use, 400 or 409 an adapter refused).

    An EngineError of no known kind is the server's own fault: 500.
    """
    match exc:
        case errors.EngineOverloaded():
            return errors.ApiError(503, Detail.SERVER_BUSY, {"Retry-After": "1"})
        case errors.EngineStopped():
            return errors.ApiError(503, Detail.SHUTTING_DOWN, {"Retry-After": "5"})
        case errors.EngineLoading():
            return errors.ApiError(503, Detail.MODEL_LOADING, {"Retry-After": "2"})
        case errors.EngineRestarted():
            return errors.ApiError(503, Detail.ENGINE_RESTARTED, {"Retry-After": "1"})
        case errors.PromptTooLong(index=None):
            return bad(Detail.PROMPT_TOO_LONG.format(n_prompt=exc.count, n_ctx=exc.n_ctx))
        case errors.PromptTooLong():
            detail = Detail.TEXT_TOO_LONG.format(
                index=exc.index, n_prompt=exc.count, n_ctx=exc.n_ctx
            )
            return bad(detail)
        case errors.InvalidPrompt():
            return bad(str(exc))
        case errors.RequestTooLarge():
            return bad(Detail.REQUEST_TOO_LARGE.format(what=exc.what, got=exc.got, limit=exc.limit))
        case errors.UnknownAdapter():
            return errors.ApiError(404, Detail.ADAPTER_UNKNOWN.format(name=exc.name))
        case errors.AdapterInUse():
            detail = Detail.ADAPTER_IN_USE.format(name=exc.name, requests=exc.requests)
            return errors.ApiError(409, detail)
        case errors.UnknownModel(name=None):
            available = ", ".join(exc.available)
            return errors.ApiError(
                404, Detail.MODEL_MISSING.format(available=available), code="model_not_found"
            )
        case errors.UnknownModel():
            available = ", ".join(exc.available)
            detail = Detail.MODEL_UNKNOWN.format(name=exc.name, available=available)
            return errors.ApiError(404, detail, code="model_not_found")
        case errors.ModelRefused():
            return bad(str(exc))
        case errors.ModelUnavailable():
            return errors.ApiError(503, exc.reason, {"Retry-After": str(exc.retry_after)})
        case errors.AdapterRefused():
            status, template = _ADAPTER_REFUSALS[exc.rule]
            fields = {"name": exc.name, "path": exc.path, "loaded_as": exc.loaded_as}
            return errors.ApiError(status, template.format(**fields, limit=exc.limit))
    return errors.ApiError(500, Detail.ENGINE_FAILED)


# Each rule of a runtime LoRA load: 400 for a request that cannot succeed as sent, 409 for one
# that conflicts with what is loaded now.
_ADAPTER_REFUSALS: dict[errors.AdapterRule, tuple[int, str]] = {
    "name_taken": (400, Detail.LORA_NAME_TAKEN),
    "no_folder": (400, Detail.LORA_NO_FOLDER),
    "outside_folder": (400, Detail.LORA_OUTSIDE_FOLDER),
    "not_a_file": (400, Detail.LORA_NOT_A_FILE),
    "not_lora": (400, Detail.LORA_NOT_AN_ADAPTER),
    "file_loaded": (409, Detail.LORA_FILE_LOADED),
    "full": (409, Detail.LORA_FULL),
}


def token_engine_error(exc: errors.EngineError, where: str) -> errors.ApiError:
    """engine_error for a request whose token ids are the list `where` ("tokens",
    "prompt[1]"): an id outside the vocabulary is named by its position in that list."""
    if isinstance(exc, errors.UnknownToken):
        return bad(
            Detail.UNKNOWN_TOKEN.format(
                where=f"{where}[{exc.position}]", token=exc.token, last=exc.n_vocab - 1
            )
        )
    return engine_error(exc)


def request_timeout(seconds: float) -> errors.ApiError:
    """504 for a request that ran past --request-timeout-s (its engine work was cancelled)."""
    return errors.ApiError(504, Detail.REQUEST_TIMEOUT.format(seconds=seconds))
