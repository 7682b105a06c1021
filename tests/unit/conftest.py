"""Shared fixtures of the unit tests."""

from __future__ import annotations

import pytest

from tests.unit.fake_backend import FakeSampler


@pytest.fixture(autouse=True)
def no_leaked_samplers() -> None:
    """Start every test with no live FakeSampler, so a test that leaked one (and failed its
    own `assert_clean`) does not fail the next one's."""
    FakeSampler.live = 0
