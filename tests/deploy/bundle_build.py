"""The bundle's build (deploy/bundle.py, ~35 s of CPU) started as soon as the session knows a
test needs it, at a lower priority, so that it runs on the cores the tests before it leave idle
instead of after them; `finished` waits for it (starting it if nothing did)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NICENESS = 10  # below the tests' own processes: the build takes the idle cores


class BundleBuild:
    """One `deploy/bundle.py build` run in the background, its output kept in a file."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._output: Path | None = None

    def start(self) -> None:
        """Start the build unless it has started."""
        if self._process is not None:
            return
        descriptor, name = tempfile.mkstemp(prefix="edgeserve-bundle-", suffix=".log")
        self._output = Path(name)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "deploy/bundle.py", "build"],
                cwd=REPO,
                stdout=descriptor,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: os.nice(NICENESS),
            )
        finally:
            os.close(descriptor)

    def finished(self, timeout: float = 900) -> tuple[int, str]:
        """Wait for the build: its exit status and everything it printed."""
        self.start()
        assert self._process is not None and self._output is not None
        code = self._process.wait(timeout)
        return code, self._output.read_text(errors="replace")

    def stop(self) -> None:
        """End a build still running (the session is over) and remove its output."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._output is not None:
            self._output.unlink(missing_ok=True)


BUILD = BundleBuild()
