"""edgeserve against its previous version (`edgeserve-baseline`): the figures compared, their
"vs previous" ratio (edgeserve / baseline) and the regression rule.

A figure regresses when edgeserve's value is worse than the baseline's (lower where higher is
better, higher where lower is better) by more than its noise, relative to the baseline's value:

- where the bench measures a figure in rounds (the load runs, greedy and sampled, at each
  concurrency; embeddings; each grounded prompt; the images' requests; the LoRA loads; the
  several-models runs and cold switches; the documents), the noise is the spread of those
  rounds: the larger of the two servers' (max - min) / median over their rounds;
- where it measures once (memory, idle CPU, multi-turn, scoring, structured output, soak,
  abuse) or has a single round, a fixed NOISE (5%);
- counts that should stay 0 (streams cut short, invalid answers, unhealthy after abuse) regress
  on any increase (noise 0);
- figures that sit near zero also need an absolute worsening beyond a floor (idle CPU: 1 point
  of a core; soak growth: 8 MiB; a stream's longest gap: 0.1 s; score difference: 1e-4), or
  their ratios would flag jitter.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The relative worsening that counts as a regression where there are no rounds to measure by.
NOISE = 0.05


def ratio(a: float | None, b: float | None) -> str:
    """a / b with two decimals, "-" when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / median of one server's rounds; None for fewer than two or a median of 0."""
    present = [float(v) for v in values if v is not None]
    if len(present) < 2:
        return None
    mid = statistics.median(present)
    return (max(present) - min(present)) / abs(mid) if mid else None


def rounds_noise(ours: Sequence[float | None], base: Sequence[float | None]) -> float:
    """The noise of a figure measured in rounds: the larger spread of the two servers' rounds,
    NOISE when either has fewer than two."""
    spreads = (spread(ours), spread(base))
    if any(s is None for s in spreads):
        return NOISE
    return max(s for s in spreads if s is not None)


@dataclass(frozen=True)
class Figure:
    """One figure of edgeserve beside its baseline's."""

    label: str
    ours: float | None
    base: float | None
    higher_is_better: bool | None  # None: neither (shown, never a regression)
    spec: str = "{:.1f}"
    noise: float = NOISE  # relative
    floor: float = 0.0  # absolute: a worsening up to this is no regression

    @property
    def ratio(self) -> str:
        """edgeserve / baseline, as the "vs previous" column shows it."""
        return ratio(self.ours, self.base)

    def worsening(self) -> float | None:
        """How much worse edgeserve is (absolute, in the figure's unit; negative: better);
        None when not comparable."""
        if self.higher_is_better is None or self.ours is None or self.base is None:
            return None
        return self.base - self.ours if self.higher_is_better else self.ours - self.base

    def regressed(self) -> bool:
        """Worse than the baseline by more than the floor and, relative to it, the noise."""
        worse = self.worsening()
        if worse is None or worse <= max(self.floor, 0.0):
            return False
        base = abs(self.base or 0.0)
        return base == 0 or worse / base > self.noise

    def line(self) -> str:
        """The figure in the regressions list."""
        assert self.ours is not None and self.base is not None
        worse = self.worsening() or 0.0
        relative = f"{worse / abs(self.base):.1%}" if self.base else "from 0"
        return (
            f"  {self.label}: {self.spec.format(self.ours)} vs {self.spec.format(self.base)}, "
            f"{relative} worse (noise {self.noise:.1%}"
            + (f", floor {self.spec.format(self.floor)}" if self.floor else "")
            + ")"
        )

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the JSON result, with the verdict."""
        return asdict(self) | {"ratio": self.ratio, "regressed": self.regressed()}


def short(revision: str, width: int = 60) -> str:
    """A baseline's "<sha> <subject>" in a line: 12 digits of the sha, the subject cut."""
    sha, _, subject = revision.partition(" ")
    if len(subject) > width:
        subject = subject[: width - 3].rstrip() + "..."
    return f"{sha[:12]} {subject}".strip()


class Versus:
    """Collects the figures compared with the baseline while the report is written."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.figures: list[Figure] = []

    def ratio(self, figure: Figure) -> str | None:
        """Record `figure` when both servers measured it; its ratio for the "vs previous"
        column (None without a baseline)."""
        if not self.active:
            return None
        if figure.ours is not None and figure.base is not None:
            self.figures.append(figure)
        return figure.ratio

    def note(self, figure: Figure) -> str:
        """The text "vs previous R" after a comma, for a line of text ("" without a baseline)."""
        shown = self.ratio(figure)
        return "" if shown is None else f", vs previous {shown}"

    def regressions(self) -> list[Figure]:
        """The figures where edgeserve is worse than the baseline beyond the noise."""
        return [f for f in self.figures if f.regressed()]

    def text(self, revision: str | None) -> list[str]:
        """The closing "Regressions" section ([] without a baseline)."""
        if not self.active:
            return []
        found = self.regressions()
        against = f"edgeserve-baseline {short(revision)}" if revision else "edgeserve-baseline"
        if not found:
            return [
                f"Regressions vs previous ({against}): none beyond the noise "
                f"({len(self.figures)} figures compared)"
            ]
        return [
            f"Regressions vs previous ({against}): {len(found)} of {len(self.figures)} "
            "figures worse beyond the noise (rounds' spread, else 5%; counts: any increase)",
            *(f.line() for f in found),
        ]
