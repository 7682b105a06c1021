"""The bench's scoring case: servers take turns pass by pass, each judged by its median pass."""

from __future__ import annotations

from bench.scoring import scored_in_turns


async def test_servers_take_turns_the_first_rotating_and_the_median_pass_counts():
    calls: list[str] = []
    took = {"a": [5.0, 1.0, 2.0], "b": [3.0, 9.0, 4.0]}

    async def fake_score(url: str, texts: list[str]) -> tuple[list[float], float]:
        calls.append(url)
        return [float(len(calls))] * len(texts), took[url][sum(c == url for c in calls) - 1]

    got = await scored_in_turns([("A", "a"), ("B", "b")], ["x", "y"], 3, fake_score)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert got["A"] == ([[1.0, 1.0], [4.0, 4.0], [5.0, 5.0]], 2.0)
    assert got["B"] == ([[2.0, 2.0], [3.0, 3.0], [6.0, 6.0]], 4.0)
