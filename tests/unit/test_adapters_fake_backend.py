"""LoRA adapters in the engine, on FakeBackend (scripted: see fake_backend.py): a step runs one
adapter set, sets take turns, the prefix cache is keyed by set, load and unload run between
steps and never pull an adapter from under a live request. The fake's logits depend on the set
each KV cell was decoded under, so a step that mixed sets or a prefix reused across sets
changes an answer."""

from __future__ import annotations

import itertools

import pytest

from edgeserve.engine.adapters import AdapterCatalog, adapter_set
from edgeserve.engine.jobs import JobState
from edgeserve.engine.speculation import NgramIndex
from edgeserve.engine.types import AdapterSet, Finished, TextDelta
from edgeserve.errors import AdapterInUse, AdapterRefused, UnknownAdapter
from tests.unit.test_engine_fake_backend import Harness, answers, finishes
from tests.unit.test_speculation_fake_backend import oracle

A: AdapterSet = ((0, 1.0),)
B: AdapterSet = ((1, 1.0),)
AB: AdapterSet = ((0, 0.5), (1, 2.0))
TWO = (("alpha", "alpha.gguf"), ("beta", "beta.gguf"))
PROMPTS = ("the cat sat", "a dog ran far", "birds sing")


def adapter_harness(**config) -> Harness:
    return Harness(lora_adapters=TWO, **config)


def solo(prompt: str, adapters: AdapterSet, **params) -> str:
    """What a cold engine answers to `prompt` alone under `adapters`."""
    h = adapter_harness()
    _, events = h.submit(prompt, adapters=adapters, **params)
    h.run_until_idle()
    return answers(events)[0]


def cached(events: list) -> int:
    return next(e.cached_tokens for e in events if isinstance(e, Finished))


def test_adapter_set_sorts_merges_and_drops_zero_scales():
    assert adapter_set([(1, 2.0), (0, 0.5)]) == AB
    assert adapter_set([(0, 1.0), (0, 0.0)]) == ()
    assert adapter_set([(0, 0.0)]) == ()
    assert adapter_set([(0, 1.0), (0, 3.0)]) == ((0, 3.0),)


def test_each_set_answers_differently_and_a_step_runs_one_set():
    base, a, b, ab = (solo("the cat sat", s) for s in ((), A, B, AB))
    assert len({base, a, b, ab}) == 4
    # The four sets at once: every decode holds rows of one set's requests, the set it runs.
    h = adapter_harness(parallel=4)
    sets_of_rows: list[tuple[AdapterSet, set[AdapterSet]]] = []

    def record(batch: list[tuple[int, int, int, bool]]) -> None:
        under = {
            choice.seq_id: job.request.adapters
            for job in h.scheduler.active
            for choice in job.choices
        }
        sets_of_rows.append((h.backend.adapters, {under[seq] for _, _, seq, _ in batch}))

    h.backend.before_decode = record
    runs = [(s, h.submit("the cat sat", adapters=s)[1]) for s in ((), A, B, AB)]
    h.run_until_idle()
    assert {ran for ran, _ in sets_of_rows} == {(), A, B, AB}
    assert all(rows == {ran} for ran, rows in sets_of_rows), sets_of_rows
    assert [answers(events)[0] for _, events in runs] == [base, a, b, ab]
    h.assert_clean()


@pytest.mark.parametrize("parallel", [3, 6])
def test_sets_interleaved_under_load_answer_as_alone(parallel):
    sets = [(), A, B]
    expected = {(p, s): solo(p, s, max_tokens=12) for p in PROMPTS for s in sets}
    h = adapter_harness(parallel=parallel, n_ctx=512)
    runs = [(p, s, h.submit(p, adapters=s, max_tokens=12)[1]) for p in PROMPTS for s in sets]
    h.run_until_idle()
    for prompt, adapters, events in runs:
        assert answers(events)[0] == expected[(prompt, adapters)], (prompt, adapters)
    assert set(h.backend.steps_under) == set(sets)
    h.assert_clean()


def test_sets_take_turns_so_none_waits_more_than_a_step_of_each_other():
    h = adapter_harness(parallel=6, n_ctx=1024)
    sets = [(), A, B]
    for adapters in sets:
        for prompt in PROMPTS[:2]:
            h.submit(prompt, adapters=adapters, max_tokens=20)
    h.run_until_idle()
    steps = h.backend.steps_under
    for adapters in sets:
        at = [i for i, s in enumerate(steps) if s == adapters]
        assert max(b - a for a, b in itertools.pairwise(at)) <= len(sets), adapters
    h.assert_clean()


def test_a_prefix_cached_under_one_set_is_not_reused_under_another():
    h = adapter_harness(parallel=1)
    prompt = "the same long prompt for every set"
    _, first = h.submit(prompt, adapters=A)
    h.run_until_idle()
    _, other = h.submit(prompt, adapters=B)
    h.run_until_idle()
    _, again = h.submit(prompt, adapters=B)
    h.run_until_idle()
    _, base = h.submit(prompt)
    h.run_until_idle()
    assert cached(first) == 0 and cached(other) == 0 and cached(base) == 0
    assert cached(again) == len(prompt)  # BOS + one token per character, the last decoded again
    assert answers(other) == answers(again) == [solo(prompt, B)]
    assert answers(base) == [solo(prompt, ())]
    h.assert_clean()


def test_scores_under_an_adapter_differ_from_the_base_and_ignore_streams_beside():
    alone = adapter_harness()
    _, events = alone.score("the cat sat", adapters=A)
    alone.run_until_idle()
    under_a = events[0].scores
    base_h = adapter_harness()
    _, base_events = base_h.score("the cat sat")
    base_h.run_until_idle()
    assert base_events[0].scores != under_a
    busy = adapter_harness()
    busy.submit("a dog ran far", adapters=B, max_tokens=10)
    _, busy_events = busy.score("the cat sat", adapters=A)
    busy.run_until_idle()
    assert busy_events[0].scores == under_a
    busy.assert_clean()


def test_unload_waits_for_no_one_it_refuses_while_in_use_then_succeeds():
    h = adapter_harness()
    _, events = h.submit("the cat sat", adapters=A, max_tokens=8)
    h.step()
    refused = h.engine.unload_adapter("alpha")
    h.step()
    with pytest.raises(AdapterInUse):
        refused.result(0)
    h.run_until_idle()
    assert answers(events) == [solo("the cat sat", A, max_tokens=8)]
    done = h.engine.unload_adapter("alpha")
    h.step()
    assert done.result(0).id == 0
    assert h.engine.adapters.named("alpha") is None and 0 not in h.backend.loaded_adapters
    h.assert_clean()


def test_a_request_under_an_adapter_unloaded_after_its_checks_gets_unknown_adapter():
    h = adapter_harness()
    unloaded = h.engine.unload_adapter("beta")
    h.step()
    assert unloaded.result(0).name == "beta"
    late, events = h.submit("the cat sat", adapters=B)  # checked before the unload ran
    h.run_until_idle()
    assert late.state is JobState.CANCELLED
    assert len(events) == 1 and isinstance(events[0], UnknownAdapter)
    h.assert_clean()


def test_load_at_run_time_gets_a_new_id_and_refuses_by_the_rules(tmp_path):
    tmp_path = tmp_path.resolve()  # adapters are kept by real path
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "bad"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
    startup = tuple((name, str(tmp_path / f"{name}.gguf")) for name in ("alpha", "beta"))
    h = Harness(lora_adapters=startup, max_loras=4)  # the folder: tmp_path, theirs
    calls = [
        (2, h.engine.load_adapter("gamma", "gamma.gguf")),
        ("not_lora", h.engine.load_adapter("delta", "bad.gguf")),
        ("name_taken", h.engine.load_adapter("alpha", "delta.gguf")),
        ("file_loaded", h.engine.load_adapter("delta", str(tmp_path / "beta.gguf"))),
        ("outside_folder", h.engine.load_adapter("delta", "../delta.gguf")),
        (3, h.engine.load_adapter("delta", "delta.gguf")),
        ("full", h.engine.load_adapter("epsilon", "epsilon.gguf")),
    ]
    h.step()
    for expected, call in calls:
        if isinstance(expected, int):
            assert call.result(0).id == expected
            continue
        with pytest.raises(AdapterRefused) as caught:
            call.result(0)
        assert caught.value.rule == expected
    names = ["alpha", "beta", "gamma", "delta"]
    assert [a.name for a in h.engine.adapters.listed()] == names
    assert h.engine.adapters.named("gamma").path == str(tmp_path / "gamma.gguf")
    assert h.backend.loaded_adapters == {0, 1, 2, 3}
    _, events = h.submit("the cat sat", adapters=((2, 1.0),))
    h.run_until_idle()
    assert answers(events) != [solo("the cat sat", ())]
    h.assert_clean()


def test_ids_are_never_reused_after_an_unload():
    catalog = AdapterCatalog()
    first = catalog.add("one", "one.gguf")
    catalog.remove("one")
    again = catalog.add("one", "one.gguf")
    assert (first.id, again.id) == (0, 1)
    assert catalog.with_id(0) is None and catalog.with_id(1) == again


def test_speculation_n_and_cancels_under_adapters_keep_every_answer(monkeypatch):
    monkeypatch.setattr(NgramIndex, "continuation", oracle(2))
    prompt = "abcabcabcabcabc"
    h = adapter_harness(draft_max=8, parallel=6, n_ctx=512)
    _, greedy_a = h.submit(prompt, adapters=A, max_tokens=30)
    doomed, _ = h.submit("xyz " + prompt, adapters=B, max_tokens=30)
    _, sampled_b = h.submit("abcd", adapters=B, max_tokens=12, n=2, temperature=1.0, seed=1)
    _, base = h.submit(prompt, max_tokens=30)
    h.step(5)
    h.engine.cancel(doomed)
    h.run_until_idle()
    h.assert_clean()
    assert h.engine.stats().draft_accepted_tokens > 0
    assert answers(greedy_a) == [solo(prompt, A, max_tokens=30)]
    assert answers(base) == [solo(prompt, (), max_tokens=30)]
    plain = adapter_harness()
    _, alone = plain.submit("abcd", adapters=B, max_tokens=12, n=2, temperature=1.0, seed=1)
    plain.run_until_idle()
    assert answers(sampled_b, 2) == answers(alone, 2)


def test_a_full_kv_cache_under_adapters_ends_the_longest_choice_and_keeps_the_rest():
    h = adapter_harness(n_ctx=128, parallel=4, n_batch=16)
    _, long_a = h.submit("xxx", adapters=A, max_tokens=300, temperature=1.0, seed=1)
    _, short_b = h.submit("yyy", adapters=B, max_tokens=8)
    h.step(40)
    _, late_base = h.submit("z" * 40, max_tokens=4)
    h.run_until_idle()
    assert finishes(long_a) == {0: "length"}
    assert sum(isinstance(e, TextDelta) for e in long_a) < 128  # cut short: 128 cells in all
    assert answers(short_b) == [solo("yyy", B, max_tokens=8)]
    assert answers(late_base) == [solo("z" * 40, (), max_tokens=4)]
    h.assert_clean()
