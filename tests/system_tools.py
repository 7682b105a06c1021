"""The programs some tests drive (nginx, haproxy, openssl, Debian's Chromium): `make test`
installs them as root (`make test-tools`) and stops when it cannot, so a missing one fails
its tests rather than skipping them quietly, unless EDGESERVE_TEST_SKIP_TOOLS=1 says to skip
them (pytest's summary then counts what was skipped)."""

from __future__ import annotations

import os
import shutil

import pytest

SKIP_TOOLS = "EDGESERVE_TEST_SKIP_TOOLS"


def skipping_tools() -> bool:
    """True when the run was told to skip the tests whose program is missing."""
    return os.environ.get(SKIP_TOOLS) == "1"


def require(program: str, package: str) -> str:
    """The path of `program`; when it is missing, the test fails saying how to install it
    (Debian's `package`), or is skipped under EDGESERVE_TEST_SKIP_TOOLS=1."""
    path = shutil.which(program)
    if path is not None:
        return path
    missing = f"{program} is not installed (apt-get install {package}; make test does, as root)"
    if skipping_tools():
        pytest.skip(f"{missing}; skipped as {SKIP_TOOLS}=1 asks")
    pytest.fail(f"{missing}; {SKIP_TOOLS}=1 skips the tests that need it", pytrace=False)
