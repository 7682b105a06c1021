"""The prompt cache's tiers below the KV cache: the store's bookkeeping (prompt_store.py), the
disk tier's files (prompt_disk.py), and the scheduler storing and restoring sequences on the
scripted FakeBackend, whose logits depend on every cell a sequence holds (a wrong restore
changes the answer)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from edgeserve.engine.prompt_disk import MAGIC, SUFFIX, PromptFiles
from edgeserve.engine.prompt_store import BLOCK, MIN_TOKENS, PromptStore, SequenceState
from edgeserve.engine.slots import common_prefix
from tests.unit.test_engine_fake_backend import Harness, answers, fresh_answer

# Documents of 80 letters (no two share their first), asked in turn: 4 of them hold more
# cells than a 256-cell cache with 2 sequences keeps.
DOCS = ["".join(chr(ord("a") + (d * 7 + i * (d + 3)) % 26) for i in range(80)) for d in range(4)]


def state(nbytes: int, tag: int = 0) -> SequenceState:
    return SequenceState(bytearray([tag % 256]) * nbytes, nbytes)


# ---- the store --------------------------------------------------------------------------------


def test_least_recently_used_states_leave_memory_first_and_the_budget_holds():
    store = PromptStore(ram_bytes=250)
    for tag in range(3):
        store.put([tag + 1] * 70, (), state(100, tag), ["ram"])
    assert [e.tokens[0] for e in store.in_tier("ram")] == [2, 3]  # 1 went first
    entry, shared = store.best([2] * 70 + [9], ())
    assert shared == 70
    assert store.load(entry) is entry.state  # 2 is now the most recently used
    store.put([4] * 70, (), state(100), ["ram"])
    assert [e.tokens[0] for e in store.in_tier("ram")] == [2, 4]
    assert store.ram_used() <= 250


def test_any_sequence_of_puts_and_lookups_finds_the_longest_prefix_within_the_budget():
    rng = random.Random(7)
    for _ in range(50):
        budget = rng.randrange(100, 1000)
        store = PromptStore(ram_bytes=budget)
        for _ in range(40):
            tokens = [rng.randrange(1, 5) for _ in range(rng.randrange(2, 6))] * 32
            if rng.random() < 0.6:
                wanted = store.wanted(tokens, (), durable=False)
                store.put(tokens, (), state(rng.randrange(10, 400)), wanted)
            else:
                found, shared = store.best(tokens, ())
                longest = max((common_prefix(e.tokens, tokens) for e in store.entries), default=0)
                assert shared == (longest if longest >= BLOCK else 0)  # what a full scan finds
                if found is not None:
                    assert store.load(found) is not None
            assert store.ram_used() <= budget
            for entry in store.entries:  # no entry is a prefix of another under one set
                others = [o for o in store.entries if o is not entry]
                assert not any(o.tokens[: len(entry.tokens)] == entry.tokens for o in others)


def test_a_longer_prompt_replaces_the_entries_it_starts_with_and_adapters_keep_apart():
    store = PromptStore(ram_bytes=10_000)
    store.put([1] * 70, (), state(10), ["ram"])
    store.put([1] * 70, ((0, 1.0),), state(10), ["ram"])
    store.put([1] * 80, (), state(10), ["ram"])
    assert sorted((len(e.tokens), e.adapters) for e in store.entries) == [
        (70, ((0, 1.0),)),
        (80, ()),
    ]
    assert store.covers([1] * 75, ())
    assert not store.covers([1] * 75, ((0, 1.0),))
    assert store.best([1] * 90, ((0, 1.0),))[1] == 70


# ---- the disk tier ----------------------------------------------------------------------------


def written(root: Path, identity: str = "model-a", cap: int = 10**9) -> tuple[PromptFiles, str]:
    files = PromptFiles(root, identity, cap)
    windows = ((8, bytearray(b"w8" * 5)), (16, bytearray(b"w16" * 3)))
    path = files.write([5, -7, 9] * 30, SequenceState(bytearray(b"kv" * 50), 100, windows, 19))
    files.close()
    return files, path


def test_an_entry_file_reads_back_exactly_after_a_restart(tmp_path: Path):
    _, path = written(tmp_path)
    again = PromptFiles(tmp_path, "model-a", 10**9)
    assert again.scan() == [(path, [5, -7, 9] * 30, Path(path).stat().st_size)]
    restored = again.read(path, [5, -7, 9] * 30)
    assert restored is not None
    assert bytes(restored.kv) == b"kv" * 50 and restored.kv_bytes == 100
    assert [(p, bytes(w)) for p, w in restored.windows] == [(8, b"w8" * 5), (16, b"w16" * 3)]
    assert restored.window_bytes == 19


def test_another_models_or_contexts_entries_are_never_read(tmp_path: Path, caplog):
    _, path = written(tmp_path, "model-a n_ctx=2048")
    other = PromptFiles(tmp_path, "model-a n_ctx=4096", 10**9)
    assert other.scan() == []  # its own folder is empty
    moved = other.folder / Path(path).name
    moved.write_bytes(Path(path).read_bytes())  # a file copied into the wrong folder
    with caplog.at_level(logging.WARNING, logger="edgeserve.engine"):
        assert other.scan() == []
    assert "another model file, context or cache type" in caplog.text
    assert not moved.exists()
    assert Path(path).exists()  # the other model's own entry stays


@pytest.mark.parametrize(
    ("damage", "at_scan"),
    [
        (lambda data: data[: len(data) // 2], True),  # truncated
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), False),  # a flipped bit in the KV
        (lambda data: b"not an entry" + data[12:], True),
        (lambda data: MAGIC + b"\xff\xff\x00\x00{}", True),  # a header longer than the file
        (lambda data: b"", True),
    ],
)
def test_a_corrupt_entry_is_ignored_with_a_log_line_and_deleted(
    tmp_path: Path, caplog, damage, at_scan: bool
):
    _, path = written(tmp_path)
    Path(path).write_bytes(damage(Path(path).read_bytes()))
    files = PromptFiles(tmp_path, "model-a", 10**9)
    with caplog.at_level(logging.WARNING, logger="edgeserve.engine"):
        found = files.scan()
        if not at_scan:
            assert [f for f, _, _ in found] == [path]
            assert files.read(path, [5, -7, 9] * 30) is None
    assert "prompt cache: ignoring" in caplog.text
    files.close()
    assert not Path(path).exists()


def test_the_files_of_every_model_stay_within_the_cap_oldest_first(tmp_path: Path):
    one, _ = written(tmp_path, "model-a")
    size = one.files_held()[1]
    files = PromptFiles(tmp_path, "model-b", cap_bytes=2 * size + size // 2)
    paths = [files.write([t] * 90, SequenceState(bytearray(b"kv" * 50), 100)) for t in (1, 2)]
    files.close()
    left = sorted(p.name for p in tmp_path.glob("*/*.prompt"))
    assert left == sorted(Path(p).name for p in paths)  # model-a's older file went


# ---- the scheduler on the fake backend ---------------------------------------------------------


def ask_each(h: Harness, question: str) -> list[tuple[int, str]]:
    """Each document with `question`, one after the other: (cached tokens, answer) of each."""
    out = []
    for doc in DOCS:
        job, events = h.submit(f"{doc} {question}", max_tokens=4)
        h.run_until_idle()
        out.append((job.cached, answers(events)[0]))
    return out


def test_documents_asked_again_are_restored_from_memory_and_answer_as_cold():
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=1 << 20)
    ask_each(h, "one")
    second = ask_each(h, "two")
    for doc, (cached, answer) in zip(DOCS, second, strict=True):
        assert cached >= len(doc)  # the document (and BOS) came back; only the rest decoded
        assert [answer] == fresh_answer(f"{doc} two", max_tokens=4)
    assert h.backend.sequences_restored >= len(DOCS) - 2
    (ram,) = h.engine.stats().prompt_cache_tiers
    assert (ram.tier, ram.hits) == ("ram", h.backend.sequences_restored)
    h.assert_clean()


def test_without_the_memory_tier_the_same_documents_are_decoded_again():
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=0)
    ask_each(h, "one")
    second = ask_each(h, "two")
    assert [cached for cached, _ in second][:2] == [1, 1]  # the BOS alone
    assert h.backend.sequences_saved == 0
    assert h.engine.stats().prompt_cache_tiers == ()


def test_a_short_prompt_is_not_stored():
    h = Harness(parallel=1, n_ctx=256, prompt_cache_ram=1 << 20)
    for text in ("short one", "other two", "short one"):
        h.submit(text, max_tokens=4)
        h.run_until_idle()
    assert h.backend.sequences_saved == 0
    assert len("short one") + 4 < MIN_TOKENS


def test_the_disk_tier_survives_a_restart_and_keeps_contexts_apart(tmp_path: Path):
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    ask_each(h, "one")
    h.scheduler.spill_free()  # as the engine thread does when it stops
    h.scheduler.store.close()
    again = Harness(parallel=2, n_ctx=256, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    (disk,) = again.engine.stats().prompt_cache_tiers
    assert (disk.tier, disk.entries) == ("disk", len(DOCS))
    second = ask_each(again, "two")
    for doc, (cached, answer) in zip(DOCS, second, strict=True):
        assert cached >= len(doc)
        assert [answer] == fresh_answer(f"{doc} two", max_tokens=4)
    assert again.engine.stats().prompt_cache_tiers[0].hits == len(DOCS)
    bigger = Harness(parallel=2, n_ctx=512, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    assert bigger.engine.stats().prompt_cache_tiers[0].entries == 0
    assert max(cached for cached, _ in ask_each(bigger, "two")) <= 1  # the BOS alone


def test_a_stored_prompt_is_restored_into_a_full_cache_after_evicting_others():
    # Two sequences of 166 cells cannot both stay in 256: each prompt evicts the other's
    # cache to the store, and the last restore needs the cells the other one holds.
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=1 << 20)
    pairs = [f"{DOCS[0]} {DOCS[1]}", f"{DOCS[2]} {DOCS[3]}", f"{DOCS[1]} {DOCS[2]}"]
    for text in pairs:
        h.submit(text, max_tokens=4)
        h.run_until_idle()
    job, events = h.submit(pairs[0] + " x", max_tokens=4)
    h.run_until_idle()
    assert job.cached >= len(pairs[0])
    assert answers(events) == fresh_answer(pairs[0] + " x", max_tokens=4)
    h.assert_clean()


def test_a_sliding_window_models_entry_comes_back_with_its_window_checkpoints():
    # Window 8: a stored sequence keeps only its last window, so a prompt sharing the
    # document but not the question goes on from the entry's checkpoint before position 80.
    h = Harness(window=8, parallel=2, n_ctx=256, prompt_cache_ram=1 << 20)
    ask_each(h, "one")
    second = ask_each(h, "two")
    for doc, (cached, answer) in zip(DOCS, second, strict=True):
        assert cached == 80  # the checkpoint at the last multiple of the window
        assert [answer] == fresh_answer(f"{doc} two", max_tokens=4)
    assert h.backend.sequences_restored >= len(DOCS) - 2
    h.assert_clean()


def test_memory_takes_a_copy_only_when_the_cells_go():
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=1 << 20)
    for doc in DOCS:
        h.submit(f"{doc} one", max_tokens=4)
        h.run_until_idle()
        saved = h.backend.sequences_saved
        h.engine.housekeeping()  # what the engine thread runs while it waits for work
        assert h.backend.sequences_saved == saved  # no disk tier: the idle engine copies none
        assert not h.scheduler.unstored()
    # Copied when their cells went to later documents, each once; what the sequences still
    # hold, not at all.
    store, slots = h.scheduler.store, h.scheduler.slots
    assert h.backend.sequences_saved == len(store.entries) >= 2
    held = [slots.held(seq) for seq in slots if len(slots.held(seq)) >= MIN_TOKENS]
    assert held and not any(store.covers(tokens, ()) for tokens in held)


def test_an_idle_engine_writes_what_its_sequences_hold_to_disk_once(tmp_path: Path):
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=1 << 20, prompt_cache_dir=str(tmp_path))
    for doc in DOCS:
        h.submit(f"{doc} one", max_tokens=4)
        h.run_until_idle()
        assert h.scheduler.unstored()
        h.engine.housekeeping()
        assert not h.scheduler.unstored()
        h.engine.housekeeping()
    h.scheduler.store.close()
    ram, disk = h.scheduler.store.tier_stats()
    # Each document written once while idle; copied again (to memory alone, its file written)
    # only when a later one took its cells.
    assert disk.entries == len(DOCS) and 1 <= ram.entries < len(DOCS)
    assert h.backend.sequences_saved == len(DOCS) + ram.entries
    assert len(list(tmp_path.rglob("*" + SUFFIX))) == len(DOCS)


def test_a_prompt_too_large_for_the_memory_tier_leaves_the_other_entries_alone():
    store = PromptStore(ram_bytes=250)
    store.put([1] * 70, (), state(100), ["ram"])
    store.put([2] * 70, (), state(300), ["ram"])  # more than the whole budget
    assert [e.tokens[0] for e in store.entries] == [1]


def test_a_sequence_the_disk_tier_cannot_take_is_not_copied_again_and_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    h = Harness(parallel=2, n_ctx=256, prompt_cache_ram=0, prompt_cache_dir=str(tmp_path))
    monkeypatch.setattr(h.backend, "save_sequence", lambda seq: None)  # llama.cpp gave no copy
    h.submit(f"{DOCS[0]} one", max_tokens=4)
    h.run_until_idle()
    h.engine.housekeeping()
    assert not h.scheduler.unstored()  # the engine thread would otherwise never sleep
    h.submit(f"{DOCS[1]} one", max_tokens=4)  # takes the other sequence
    h.run_until_idle()
    assert h.scheduler.unstored()


def test_the_lookup_compares_every_entry_sharing_the_most_blocks():
    store = PromptStore(ram_bytes=10_000)
    system = list(range(100, 100 + BLOCK))  # one shared block, then three ways on
    for branch in (1, 2, 3):
        store.put(system + [branch] * 40, (), state(10), ["ram"])
    for branch in (3, 1, 2):
        entry, shared = store.best(system + [branch] * 30 + [9], ())
        assert entry is not None and entry.tokens[-1] == branch and shared == BLOCK + 30
    assert store.best(list(range(100, 100 + BLOCK - 1)) + [7] * 40, ())[1] == 0  # no block


# ---- idle sequences leave the KV cache while others generate -----------------------------


def idle_cells(h: Harness) -> dict[int, int]:
    """Cells each free sequence holds in the backend's KV cache."""
    slots, backend = h.scheduler.slots, h.backend
    return {seq: len(backend.history(seq)) for seq in slots if backend.history(seq)}


def test_a_starting_generation_moves_the_idle_sequences_to_memory_and_answers_alike():
    # A decode in a unified cache attends over every used cell: while anything generates,
    # what the free sequences hold waits in host memory instead.
    rng = random.Random(3)
    restored = 0
    for _ in range(20):
        h = Harness(parallel=4, n_ctx=1024, prompt_cache_ram=1 << 20)
        asked: list[str] = []  # documents
        for _ in range(8):
            doc = rng.choice(DOCS)
            text = f"{doc} {rng.choice(['one', 'two', 'three'])}"
            job, events = h.submit(text, max_tokens=rng.randrange(2, 6))
            h.engine.step()  # admitted, its prefill begun
            assert not idle_cells(h)
            h.run_until_idle()
            assert answers(events) == fresh_answer(text, max_tokens=job.request.params.max_tokens)
            if doc in asked:
                assert job.cached >= len(doc)  # not decoded again
            asked.append(doc)
        restored += h.backend.sequences_restored
        h.assert_clean()
    assert restored >= 20


def test_without_the_memory_tier_or_room_in_it_idle_sequences_keep_their_cells():
    for ram in (0, 64):  # off; smaller than any document's state
        h = Harness(parallel=4, n_ctx=1024, prompt_cache_ram=ram)
        for doc in DOCS[:3]:  # together: three sequences
            h.submit(f"{doc} one", max_tokens=4)
        h.run_until_idle()
        for question in ("one", "two"):
            h.submit(f"{DOCS[3]} {question}", max_tokens=4)
            h.engine.step()
            assert len(idle_cells(h)) == 2  # its lead took the third
            h.run_until_idle()
        # Tried once (the lead's cells, and the two idle ones at the first start), not again.
        assert h.backend.sequences_saved == (0 if ram == 0 else 3)
        h.assert_clean()
