"""How many inputs each fuzz test tries, and how reproducibly.

In CI (no EDGESERVE_FUZZ_EXAMPLES) every test runs its own small number of examples,
derandomized (the seed is derived from the test, so every run tries the same inputs) and
without an example database (nothing is read from or written to .hypothesis/): a failure
reproduces by running the test again. An exploratory campaign sets EDGESERVE_FUZZ_EXAMPLES=N:
every fuzz test then tries N random inputs (a new seed per run; Hypothesis prints the seed
and the failing example, and `--hypothesis-seed=S` replays a run).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES_VARIABLE = "EDGESERVE_FUZZ_EXAMPLES"


def fuzz_settings(examples: int) -> settings:
    """The settings of a fuzz test that tries `examples` inputs in CI."""
    explore = os.environ.get(EXAMPLES_VARIABLE)
    return settings(
        max_examples=int(explore) if explore else examples,
        derandomize=not explore,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
