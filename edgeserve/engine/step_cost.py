"""What a decode costs on this hardware, learned from the steps the engine runs.

Two things depend on it. Speculation (speculation.py) drafts a token only when its chance of
being kept is above the share of the step one more logit row costs (`StepCost.threshold`).
Prefill beside running streams (policy.py) takes as many prompt tokens as keep the step
within its time budget (`StepCost.prompt_tokens_within`), so a newcomer's prompt holds the
streams' next tokens for a bounded time whatever the hardware.

A step's time is modelled as `fixed + per_row * rows + per_token * prompt_tokens`: `fixed`
and `per_row` are a least-squares line over the steps of two or more rows without prompt
tokens, `per_token` a fit through the origin of what the steps with prompt tokens took beyond
that line. Older steps weigh less, so the model follows the machine's load.

The line is only the trend: each number of rows a recent step had is also timed on its own
and that time wins where it is known. llama.cpp's kernels are not linear in rows. On a 2-core
AVX2 CPU (Gemma 3 270M, Q4_K_M) one row takes 17 ms (a vector product), 4 rows 44, 8 rows
61, 16 rows 83, 32 rows 129, but 5 rows 68 and 6 rows 73: the repacked matrix kernels take
rows four at a time and the rest one by one. Speculation (speculation.py) uses these times
to pick draft lengths. A size not stepped recently is estimated from a curve the engine
times when it loads, on a quiet machine (`calibrate`: steps of 1, 4, 8 and 16 rows), scaled by
how much slower the recent steps ran than that curve says; a line fitted on a few small sizes
would say long drafts cost far more than they do. Without a curve (a backend that cannot time
steps), the line stands in.
"""

from __future__ import annotations

import math

# Weight left to earlier steps at each recorded step.
STEP_MEMORY = 0.995
# The spread of rows (variance, in rows squared) below which the steps say nothing of a row's
# cost: the threshold is then PRIOR_THRESHOLD.
MIN_ROW_SPREAD = 0.05
PRIOR_THRESHOLD = 0.5
# A prompt token is taken to cost at least this much (a measured 0 would make room for any
# number of them).
MIN_TOKEN_SECONDS = 1e-6
# A size's own time is used while its steps' weight (each step's decaying by STEP_MEMORY at
# every step recorded since) is at least this: one step's time lasts ~240 steps.
MIN_SIZE_WEIGHT = 0.3
# The sizes (logit rows) of the steps timed when the engine loads (`StepCost.calibrate`).
CALIBRATION_ROWS = (1, 4, 8, 16)
# Steps recorded before `cheapest` works a range out again (each answer is 1 + 32 lookups).
CHEAPEST_REFRESH = 16


class StepCost:
    """Decode time against logit rows and prompt tokens (see the module docstring)."""

    def __init__(self) -> None:
        self._weight = 0.0
        self._rows = 0.0
        self._rows2 = 0.0
        self._seconds = 0.0
        self._cross = 0.0
        self._tokens2 = 0.0
        self._token_seconds = 0.0
        self._line: tuple[float, float] | None = None
        self._steps = 0  # steps without prompt tokens recorded
        self._curve: list[tuple[int, float]] = []  # (rows, seconds) timed at load, by rows
        self._load_weight = 0.0  # recent steps' time over the curve's: weighted sums
        self._load_ratio = 0.0
        # Per number of rows: (weight, weighted seconds, self._steps when last recorded).
        self._sizes: dict[int, tuple[float, float, int]] = {}
        # Per range of rows: (the cheapest step in it, self._steps when worked out).
        self._cheapest: dict[tuple[int, int], tuple[float, int]] = {}

    def record(self, rows: int, seconds: float, prompt_tokens: int = 0) -> None:
        """One generation step: `rows` logit rows and `prompt_tokens` other tokens of
        prompts, decoded in `seconds`."""
        keep = STEP_MEMORY
        if prompt_tokens > 0:
            beyond = max(0.0, seconds - (self.generation_seconds(rows) or 0.0))
            self._tokens2 = keep * self._tokens2 + prompt_tokens * prompt_tokens
            self._token_seconds = keep * self._token_seconds + prompt_tokens * beyond
            return
        self._steps += 1
        if self._curve:
            self._load_weight = keep * self._load_weight + 1.0
            self._load_ratio = keep * self._load_ratio + seconds / self._on_curve(rows)
        weight, total, at = self._sizes.get(rows, (0.0, 0.0, self._steps))
        fade = keep ** (self._steps - at)
        self._sizes[rows] = (fade * weight + 1.0, fade * total + seconds, self._steps)
        if rows <= 1:
            return
        self._weight = keep * self._weight + 1.0
        self._rows = keep * self._rows + rows
        self._rows2 = keep * self._rows2 + rows * rows
        self._seconds = keep * self._seconds + seconds
        self._cross = keep * self._cross + rows * seconds
        self._fit_line()

    def _fit_line(self) -> None:
        """Refit the row line from the weighted sums; while the recent steps' rows hardly
        vary they say nothing of a row's cost, and the line of when they last did stays."""
        mean_rows = self._rows / self._weight
        spread = self._rows2 / self._weight - mean_rows * mean_rows
        if spread < MIN_ROW_SPREAD:
            return
        mean_seconds = self._seconds / self._weight
        per_row = max(0.0, (self._cross / self._weight - mean_rows * mean_seconds) / spread)
        self._line = max(0.0, mean_seconds - per_row * mean_rows), per_row

    def line(self) -> tuple[float, float] | None:
        """(fixed, per_row) seconds, as last fitted (None while the steps' rows have never
        varied)."""
        return self._line

    def generation_seconds(self, rows: int) -> float | None:
        """The expected time of a step of `rows` logit rows and no prompt tokens: the recent
        steps of that size's mean, else the line, else the recent steps' time per row; None
        before any step."""
        timed = self._size_seconds(rows)
        if timed is not None:
            return timed
        if self._curve:
            load = self._load_ratio / self._load_weight if self._load_weight else 1.0
            return self._on_curve(rows) * load
        line = self.line()
        if line is not None:
            return line[0] + line[1] * rows
        if self._rows > 0.0:
            return self._seconds / self._rows * rows
        one = self._size_seconds(1)
        return None if one is None else one * rows

    def cheapest(self, first: int, last: int) -> float:
        """The least `generation_seconds` of any number of rows from `first` to `last` (0 when
        no step is known or the range is empty), as worked out at most CHEAPEST_REFRESH
        recorded steps ago: a bound a caller checks once instead of each size."""
        key = (first, last)
        known = self._cheapest.get(key)
        if known is not None and self._steps - known[1] < CHEAPEST_REFRESH:
            return known[0]
        sizes = range(first, last + 1)
        least = min((self.generation_seconds(rows) or 0.0 for rows in sizes), default=0.0)
        self._cheapest[key] = (least, self._steps)
        return least

    def calibrate(self, timed: list[tuple[int, float]]) -> None:
        """Steps of several sizes, (rows, seconds), timed on a quiet machine: the curve that
        stands in for sizes not stepped recently (recorded as steps too)."""
        self._curve = sorted((rows, max(seconds, MIN_TOKEN_SECONDS)) for rows, seconds in timed)
        self._cheapest.clear()
        for rows, seconds in self._curve:
            self.record(rows, seconds)

    @property
    def curve(self) -> list[tuple[int, float]]:
        """The (rows, seconds) timed by `calibrate`, by rows ([] without calibration)."""
        return list(self._curve)

    def _on_curve(self, rows: int) -> float:
        """The calibration curve at `rows`: linear between its points, and past its ends
        along its first or last segment (never below a microsecond)."""
        curve = self._curve
        if len(curve) == 1:
            return curve[0][1] * max(1, rows) / curve[0][0]
        i = 1
        while i < len(curve) - 1 and curve[i][0] < rows:
            i += 1
        (r0, t0), (r1, t1) = curve[i - 1], curve[i]
        return max(MIN_TOKEN_SECONDS, t0 + (t1 - t0) * (rows - r0) / (r1 - r0))

    def _size_seconds(self, rows: int) -> float | None:
        """The mean time of the recent steps of `rows` rows (None: none recent enough)."""
        weight, total, at = self._sizes.get(rows, (0.0, 0.0, 0))
        if weight * STEP_MEMORY ** (self._steps - at) < MIN_SIZE_WEIGHT:
            return None
        return total / weight

    def fixed_seconds(self) -> float:
        """What a step costs before its rows (0 until it is known)."""
        line = self.line()
        return line[0] if line is not None else 0.0

    def row_seconds(self) -> float:
        """What one more logit row adds to a step (0 until it is known)."""
        line = self.line()
        return line[1] if line is not None else 0.0

    def token_seconds(self) -> float | None:
        """What one prompt token adds to a step; None before a step with prompt tokens."""
        if self._tokens2 <= 0.0:
            return None
        return self._token_seconds / self._tokens2

    def prompt_tokens_within(self, seconds: float, rows: int) -> int | None:
        """How many prompt tokens a step of `rows` logit rows can take and still last at
        most `seconds`; None while either cost is unknown."""
        step = self.generation_seconds(rows)
        per_token = self.token_seconds()
        if step is None or per_token is None:
            return None
        fit = (seconds - step) / max(per_token, MIN_TOKEN_SECONDS)
        return max(0, math.floor(fit + 1e-9))  # 1e-9: 9.999… tokens of float error are 10

    def threshold(self, sequences: int) -> float:
        """The chance of being kept a drafted token needs to pay in a step of `sequences`
        next tokens: the share of that step one more row costs (then the tokens it is
        expected to add come at least as fast as the step's own)."""
        line = self.line()
        if line is None:
            return PRIOR_THRESHOLD
        fixed, per_row = line
        step = fixed + per_row * max(1, sequences)
        return 0.0 if step <= 0.0 else per_row * max(1, sequences) / step
