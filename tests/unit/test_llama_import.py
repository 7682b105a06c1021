"""What edgeserve sets before llama.cpp's libraries load (edgeserve/llama_import.py): OpenMP's
spin count, read by the real libgomp when llama.cpp's CPU library loads it (OMP_DISPLAY_ENV
prints what libgomp took), and a user's own OpenMP setting left as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgeserve.llama_import import SPIN_COUNT, bound_openmp_spinning

REPO = Path(__file__).resolve().parents[2]


def libgomp_settings(**env: str) -> dict[str, str]:
    """The settings libgomp reports once edgeserve's engine is imported in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    done = subprocess.run(
        [sys.executable, "-c", "import edgeserve.engine.llama.model"],
        cwd=REPO,
        env={**clean, "OMP_DISPLAY_ENV": "verbose", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pairs = (line.strip().split(" = ", 1) for line in done.stderr.splitlines() if " = " in line)
    return {name: value.strip("'") for name, value in pairs}


def test_llama_cpp_s_openmp_threads_spin_briefly_between_steps():
    assert libgomp_settings()["GOMP_SPINCOUNT"] == SPIN_COUNT


def test_a_user_s_own_openmp_waiting_is_kept():
    assert libgomp_settings(GOMP_SPINCOUNT="7")["GOMP_SPINCOUNT"] == "7"
    active = libgomp_settings(OMP_WAIT_POLICY="active")
    assert active["OMP_WAIT_POLICY"] == "ACTIVE" and active["GOMP_SPINCOUNT"] != SPIN_COUNT
    env: dict[str, str] = {"OMP_WAIT_POLICY": "passive"}
    bound_openmp_spinning(env)
    assert env == {"OMP_WAIT_POLICY": "passive"}
