"""The sampling checks and mapping the generating endpoints share: n, token budgets, value
ranges, logit_bias and stop strings."""

from __future__ import annotations

import json
import math
import re
from typing import Final, Protocol

from edgeserve.api.reference.detail import Detail
from edgeserve.api.reference.limits import Limits, bad
from edgeserve.engine.types import SamplingParams

_TOKEN_ID: Final = re.compile(r"[0-9]{1,9}")
_LOGIT_BIAS_BOUND: Final = 100.0
INT32_MAX: Final = 2**31 - 1
MAX_TOP_LOGPROBS: Final = 20
"""The most alternatives per token: chat's top_logprobs (OpenAI's limit) and the legacy
completions' logprobs (OpenAI allows 5 there)."""


class SamplingFields(Protocol):
    """The sampling fields chat and completions requests share."""

    @property
    def n(self) -> int: ...
    @property
    def do_sample(self) -> bool | None: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def min_p(self) -> float | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def presence_penalty(self) -> float | None: ...
    @property
    def frequency_penalty(self) -> float | None: ...
    @property
    def repetition_penalty(self) -> float | None: ...
    @property
    def logit_bias(self) -> dict[str, float] | None: ...
    @property
    def stop(self) -> str | list[str] | None: ...


def sampling_params(
    req: SamplingFields,
    limits: Limits,
    token_field: str,
    max_tokens: int | None,
) -> SamplingParams:
    """The checks and mapping chat and completions share (see chat._chat_params);
    `max_tokens` is the value of the field named `token_field` (None: only the context limits
    it)."""
    if req.n < 1:
        raise bad(Detail.NOT_POSITIVE.format(name="n", value=req.n))
    if req.n > limits.max_n:
        raise bad(Detail.OVER_LIMIT.format(name="n", value=req.n, limit=limits.max_n))
    check_max_tokens(token_field, max_tokens, limits)
    check_range("temperature", req.temperature, low=0.0)
    check_range("top_p", req.top_p, low=0.0, high=1.0)
    check_range("presence_penalty", req.presence_penalty, low=-2.0, high=2.0)
    check_range("top_k", req.top_k, low=0)
    check_range("min_p", req.min_p, low=0.0, high=1.0)
    check_range("frequency_penalty", req.frequency_penalty, low=-2.0, high=2.0)
    check_range("repetition_penalty", req.repetition_penalty, low=0.0, low_open=True)
    check_range("seed", req.seed, low=-(2**63), high=2**63 - 1)
    do_sample = True if req.do_sample is None else req.do_sample
    temperature = 1.0 if req.temperature is None else req.temperature
    if req.n > 1:
        do_sample, temperature = True, temperature or 1.0
    optional = {
        "top_p": req.top_p,
        "top_k": None if req.top_k is None else min(req.top_k, INT32_MAX),
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
        stop=stop_strings(req.stop),
        **{name: value for name, value in optional.items() if value is not None},
    )


def check_max_tokens(name: str, value: int | None, limits: Limits) -> None:
    """400 unless the token budget in the field `name` is unset or 1 to the server's cap."""
    if value is not None and value < 1:
        raise bad(Detail.NOT_POSITIVE.format(name=name, value=value))
    if value is not None and limits.max_tokens is not None and value > limits.max_tokens:
        raise bad(Detail.OVER_LIMIT.format(name=name, value=value, limit=limits.max_tokens))


def check_range(
    name: str,
    value: float | None,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    """400 unless `value` is unset, or finite and from `low` (excluded when `low_open`) to
    `high`."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(Detail.NOT_FINITE.format(name=name, value=value))
    if high is not None and not low <= value <= high:
        raise bad(Detail.OUT_OF_RANGE.format(name=name, low=low, high=high, value=value))
    if low_open and value <= low:
        raise bad(Detail.NOT_ABOVE.format(name=name, low=low, value=value))
    if value < low:
        raise bad(Detail.BELOW.format(name=name, low=low, value=value))


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """Token-id strings → ints; values clamped to [-100, 100] as OpenAI does."""
    result: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not _TOKEN_ID.fullmatch(key):
            raise bad(Detail.LOGIT_BIAS_KEY.format(key=json.dumps(key, ensure_ascii=False)))
        if not math.isfinite(value):
            raise bad(Detail.NOT_FINITE.format(name=f"logit_bias[{key}]", value=value))
        result[int(key)] = min(max(value, -_LOGIT_BIAS_BOUND), _LOGIT_BIAS_BOUND)
    return result


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A string or list of strings → a tuple, empty strings dropped."""
    if stop is None:
        return ()
    candidates = [stop] if isinstance(stop, str) else stop
    return tuple(text for text in candidates if text)
