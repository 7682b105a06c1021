"""Ollama's `options` as the engine's sampling: its types checked as Ollama checks them, its
defaults (temperature 0.8, top_k 40, top_p 0.9) where a request leaves a value out, ranges as
the other APIs check them. Options edgeserve has no use for (num_thread, mirostat, …) are
ignored, as Ollama ignores options it does not know."""

from __future__ import annotations

import math
from typing import Any, Final

from edgeserve.api.common.sampling import INT32_MAX, check_max_tokens, check_range, stop_strings
from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad
from edgeserve.engine.types import SamplingParams

DEFAULTS: Final[dict[str, float]] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
"""Ollama's own defaults for the sampling options a request leaves out."""

_FLOATS: Final = (
    "temperature",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_INTS: Final = ("top_k", "seed", "num_predict", "num_ctx")


def read_options(options: dict[str, Any] | None, limits: Limits) -> SamplingParams:
    """`options` as sampling parameters: 400 (Ollama's words) for a value of the wrong type,
    then the ranges. num_predict ≤ 0 means no limit but the context's, as at Ollama; a
    negative seed means none. `num_ctx` is checked and changes nothing: the context is the
    loaded model's (--ctx-size; clients send the GGUF's training context, as llama-index's
    does by default, and Ollama caps what the model cannot hold)."""
    given = dict(options or {})
    values: dict[str, Any] = {}
    for name in _FLOATS:
        if given.get(name) is not None:
            values[name] = _number(name, given[name])
    for name in _INTS:
        if given.get(name) is not None:
            values[name] = _integer(name, given[name])
    stop = given.get("stop")
    if stop is not None and not (
        isinstance(stop, list) and all(isinstance(text, str) for text in stop)
    ):
        raise bad(Detail.OLLAMA_OPTION_TYPE.format(name="stop", kind="array"))
    merged = DEFAULTS | values
    check_range("temperature", merged["temperature"], low=0.0)
    check_range("top_p", merged["top_p"], low=0.0, high=1.0)
    check_range("top_k", merged["top_k"], low=0)
    check_range("min_p", values.get("min_p"), low=0.0, high=1.0)
    check_range("repeat_penalty", values.get("repeat_penalty"), low=0.0, low_open=True)
    check_range("presence_penalty", values.get("presence_penalty"), low=-2.0, high=2.0)
    check_range("frequency_penalty", values.get("frequency_penalty"), low=-2.0, high=2.0)
    check_range("seed", values.get("seed"), low=-(2**63), high=2**63 - 1)
    num_predict = values.get("num_predict")
    max_tokens = num_predict if num_predict is not None and num_predict > 0 else None
    check_max_tokens("num_predict", max_tokens, limits)
    num_ctx = values.get("num_ctx")
    if num_ctx is not None and num_ctx < 1:
        raise bad(Detail.NOT_POSITIVE.format(name="num_ctx", value=num_ctx))
    seed = values.get("seed")
    optional = {
        "min_p": values.get("min_p"),
        "seed": seed if seed is not None and seed >= 0 else None,
        "repeat_penalty": values.get("repeat_penalty"),
        "presence_penalty": values.get("presence_penalty"),
        "frequency_penalty": values.get("frequency_penalty"),
    }
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=merged["temperature"],
        top_p=merged["top_p"],
        top_k=min(int(merged["top_k"]), INT32_MAX),
        stop=stop_strings(stop),
        **{name: value for name, value in optional.items() if value is not None},
    )


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(Detail.OLLAMA_OPTION_TYPE.format(name=name, kind="float32"))
    if not math.isfinite(value):
        raise bad(Detail.NOT_FINITE.format(name=name, value=value))
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(Detail.OLLAMA_OPTION_TYPE.format(name=name, kind="integer"))
    if isinstance(value, float) and not value.is_integer():
        raise bad(Detail.OLLAMA_OPTION_TYPE.format(name=name, kind="integer"))
    return int(value)
