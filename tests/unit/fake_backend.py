"""FakeBackend: a scripted, batch-invariant stand-in for llama.cpp, for tests of the engine's
scheduling logic only (the integration tests run the real model).

It keeps a unified KV cache the way llama.cpp does: cells shared between sequences after
`seq_cp`, a fixed number of cells (`decode` returns 1 and stores nothing when a batch does
not fit), and a batch whose positions for a sequence do not continue exactly where that
sequence ends is refused with -1, as llama.cpp refuses it. A row's logits are a pure function
of its sequence's whole token history, so a wrong KV copy, a stale cell or a skipped prompt
chunk changes the answer. Text is one letter per token.

With `window` > 0 it has sliding-window attention with window-sized caches, as llama.cpp has
for Gemma 3 without `swa_full`: a decode drops every sequence's positions that the window of
its next one no longer finds (its first position moves up), decoding a position whose window
misses cells is refused with -1, and `save_window` / `restore_window` copy a window out and
back (a restore onto other tokens than the copy's fails the test).

LoRA adapters: any path loads but "bad.gguf"; a decode runs under the set `use_adapters` named
last (every adapter in it must be loaded), each cell remembers the set it was decoded under
and a row's logits depend on those sets, so KV reused under another set changes the answer.
`steps_under` records each decode's set.

With `draft_model_path` set it has a draft context (`FakeDraftContext`) of the same kind:
cells per sequence, no room past `n_cells`, positions that must continue each sequence; its
greedy tokens are the scripted model's own ("self"), or ("sloppy") a wrong token at every
third position.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Sequence

import numpy as np

from edgeserve.engine.draft_model import batch_size
from edgeserve.engine.types import (
    AdapterSet,
    ChatPrompt,
    EngineConfig,
    SamplingParams,
    TokenizerInfo,
)
from edgeserve.errors import InvalidAdapter, InvalidPrompt

VOCAB = 40
EOS = 1
BOS = 2
FIRST_LETTER = 8  # tokens 8 … 33 are the letters a … z; the others are spaces
SPACE = FIRST_LETTER + 26  # the space a prompt is tokenized to
# A grammar text the fake "parses": "letters" allows letters only; these two misbehave.
GRAMMAR_RAISES_ON_ADMIT = "raise on admit"
GRAMMAR_RAISES_ON_SAMPLE = "raise on sample"
GRAMMAR_SLOW = "slow"  # letters only, 0.3 s per token
# Letters only, STAGGER_S x (choice index + 1) per token: one step's samples arrive apart.
GRAMMAR_STAGGERED = "staggered"
STAGGER_S = 0.01
SEED_RAISES = 666  # a sampler with this seed raises when it samples (on the engine thread)


def history_logits(history: Sequence[int], under: Sequence[AdapterSet] = ()) -> np.ndarray:
    """The scripted model: logits that depend on every token before (EOS kept unlikely), and
    on the LoRA adapter set each was decoded `under` when any was decoded under one."""
    key = (tuple(history), tuple(under)) if any(under) else tuple(history)
    rng = random.Random(hash(key))
    row = np.array([rng.uniform(-4.0, 4.0) for _ in range(VOCAB)], dtype=np.float32)
    row[EOS] -= 6.0
    row[BOS] = -30.0
    return row


class FakeBatch:
    """The `Batch` protocol over Python lists."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens: list[tuple[int, int, int, bool]] = []

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def room(self) -> int:
        return self.capacity - len(self.tokens)

    def clear(self) -> None:
        self.tokens = []

    def add(self, token: int, pos: int, seq: int, output: bool) -> int:
        assert self.room > 0, "batch overflow"
        self.tokens.append((token, pos, seq, output))
        return len(self.tokens) - 1

    def add_span(
        self, tokens: Sequence[int], start_pos: int, seq: int, outputs: Sequence[int] = ()
    ) -> int:
        first = len(self.tokens)
        for offset, token in enumerate(tokens):
            self.add(token, start_pos + offset, seq, offset in outputs)
        return first


class FakeDraftContext:
    """The `DraftContext` protocol, scripted (see the module docstring)."""

    def __init__(self, config: EngineConfig) -> None:
        assert config.draft_model_path in ("self", "sloppy")
        self.sloppy = config.draft_model_path == "sloppy"
        self.n_seq = config.parallel
        self.n_cells = config.n_ctx
        self.batch = FakeBatch(batch_size(config.prefill_chunk, config.parallel))
        self.seqs: dict[int, list[int]] = {s: [] for s in range(self.n_seq)}
        self.decodes: list[list[tuple[int, int, int, bool]]] = []
        self.no_room = 0  # decodes answered 1
        self.refused = 0  # decodes answered -1: positions that do not continue a sequence
        self._rows: list[int | None] = []
        # Tests script failures: called before each decode, may return a status or raise.
        self.before_decode: Callable[[list[tuple[int, int, int, bool]]], int | None] | None = None

    def decode(self) -> int:
        batch = list(self.batch.tokens)
        self.decodes.append(batch)
        if self.before_decode is not None and (status := self.before_decode(batch)) is not None:
            return status
        ends = {seq: len(tokens) for seq, tokens in self.seqs.items()}
        for _, pos, seq, _ in batch:
            if pos != ends[seq]:
                self.refused += 1
                return -1
            ends[seq] += 1
        if sum(map(len, self.seqs.values())) + len(batch) > self.n_cells:
            self.no_room += 1
            return 1
        self._rows = []
        for token, _, seq, output in batch:
            self.seqs[seq].append(token)
            self._rows.append(self._greedy(self.seqs[seq]) if output else None)
        return 0

    def _greedy(self, history: list[int]) -> int:
        best = int(np.argmax(history_logits(history)))
        if self.sloppy and len(history) % 3 == 0:
            return FIRST_LETTER + (best - FIRST_LETTER + 1) % 26
        return best

    def greedy(self, row: int) -> int:
        token = self._rows[row]
        assert token is not None, "row has no logits"
        return token

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        assert p1 == -1, "the draft model only trims a sequence's end"
        del self.seqs[seq][max(0, p0) :]
        return True

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        cells = self.seqs[seq]
        return (0, len(cells) - 1) if cells else (-1, -1)

    def clear(self) -> None:
        self.seqs = {s: [] for s in range(self.n_seq)}


class FakeSampler:
    """Greedy or seeded sampling over the fake logits, with logit_bias and a letters-only
    'grammar' (detached, as the real one: sampled from a copied row on a grammar thread)."""

    live = 0

    def __init__(
        self, backend: FakeBackend, params: SamplingParams, seed_offset: int, gbnf: str | None
    ) -> None:
        if gbnf == GRAMMAR_RAISES_ON_ADMIT:
            raise RuntimeError("scripted failure while making a sampler")
        self.backend = backend
        self.params = params
        self.gbnf = gbnf
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        self.rng = random.Random(seed + seed_offset)
        self.seed_offset = seed_offset
        self.slow = False
        self.step_limit_s = 2.0
        self.detached = gbnf is not None
        self.freed = False
        FakeSampler.live += 1

    def sample(self, row: int) -> int | None:
        assert not self.detached, "a grammar sampler samples a copied row"
        if self.params.seed == SEED_RAISES:
            raise RuntimeError("scripted failure while sampling in place")
        return self.sample_logits(self.backend.logit_row(row))

    def sample_logits(self, row: np.ndarray) -> int | None:
        assert not self.freed, "sampling with a freed sampler"
        if self.gbnf == GRAMMAR_RAISES_ON_SAMPLE:
            raise RuntimeError("scripted failure while sampling")
        if self.gbnf == GRAMMAR_SLOW:
            time.sleep(0.3)
        if self.gbnf == GRAMMAR_STAGGERED:
            time.sleep(STAGGER_S * (self.seed_offset + 1))
        logits = row.astype(np.float64)
        for token, bias in self.params.logit_bias.items():
            logits[token] += bias
        if self.gbnf is not None:
            logits[:FIRST_LETTER] = -np.inf
            logits[FIRST_LETTER + 26 :] = -np.inf
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = np.exp((logits - logits.max()) / self.params.temperature)
        probs /= probs.sum()
        return int(self.rng.choices(range(VOCAB), weights=probs.tolist())[0])

    def free(self) -> None:
        assert not self.freed, "sampler freed twice"
        self.freed = True
        FakeSampler.live -= 1


class FakeBackend:
    """The `Backend` protocol, scripted (see the module docstring)."""

    def __init__(
        self, config: EngineConfig, window: int = 0, budget: int | None = None, gpu: bool = False
    ) -> None:
        self.config = config
        self.n_ctx = config.n_ctx
        self.n_vocab = VOCAB
        self.n_seq = config.parallel
        self.is_classifier = False
        self.media_kinds: frozenset[str] = frozenset()
        self.n_swa = window
        self.row_multiple = 1
        self.window_sized = window > 0
        self.checkpoint_budget = (config.n_ctx if budget is None else budget) if window else 0
        # A sequence's first position still held (tests move it up too).
        self.swa_lost: dict[int, int] = {}
        self.windows_restored = 0
        self.add_bos = True
        self.bos = BOS
        self.max_piece_bytes = 1
        self.gpu_offload = gpu  # only what the engine decides by: the fake runs on the CPU
        self.n_gpu_layers = 1 if gpu else 0
        self.flash_attn = False
        self.cache_identity = f"fake n_ctx={config.n_ctx} window={window}"
        self.sequences_saved = 0
        self.sequences_restored = 0
        self.tokenizer_info = TokenizerInfo(
            "fake", "<bos>", "<eos>", None, True, False, VOCAB, config.n_ctx, ""
        )
        self.batch = FakeBatch(config.n_batch)
        self.draft_context = FakeDraftContext(config) if config.draft_model_path else None
        self._cells = itertools.count()
        self._seqs: dict[int, list[tuple[int, int]]] = {s: [] for s in range(self.n_seq)}
        self._rows: list[np.ndarray] = []
        self._score_history: list[int] = []
        self._score_rows: list[np.ndarray] = []
        self.holds_score_context = False
        self.decodes: list[list[tuple[int, int, int, bool]]] = []
        self.tokenized_bytes = 0
        self.resets = 0
        # Tests script failures: called before each decode, may return a status to report.
        self.before_decode: Callable[[list[tuple[int, int, int, bool]]], int | None] | None = None
        self.fail_score = False
        self.loaded_adapters: set[int] = set()
        self.adapters: AdapterSet = ()
        self.steps_under: list[AdapterSet] = []
        self._cell_under: dict[int, AdapterSet] = {}
        for adapter_id, (_, path) in enumerate(config.lora_adapters):
            self.load_adapter(adapter_id, path)

    # ---- LoRA adapters --------------------------------------------------------------------

    def load_adapter(self, adapter_id: int, path: str) -> None:
        if path.endswith("bad.gguf"):
            raise InvalidAdapter(f"{path} is not a LoRA adapter of this model")
        assert adapter_id not in self.loaded_adapters, "an adapter id reused"
        self.loaded_adapters.add(adapter_id)

    def free_adapter(self, adapter_id: int) -> None:
        self.loaded_adapters.remove(adapter_id)
        self.adapters = ()

    def use_adapters(self, adapters: AdapterSet) -> None:
        missing = [i for i, _ in adapters if i not in self.loaded_adapters]
        assert not missing, f"a step under adapters {missing} that are not loaded"
        self.adapters = adapters

    # ---- generation -------------------------------------------------------------------

    def cells_used(self) -> int:
        return len({cell for cells in self._seqs.values() for _, cell in cells})

    def decode(self) -> int:
        batch = list(self.batch.tokens)
        self.decodes.append(batch)
        self.steps_under.append(self.adapters)
        if self.before_decode is not None and (status := self.before_decode(batch)) is not None:
            return status
        ends = {seq: len(cells) for seq, cells in self._seqs.items()}
        for _, pos, seq, _ in batch:
            if pos != ends[seq]:
                return -1  # llama.cpp: positions of a sequence must continue its cells
            if self.window_sized and self.swa_lost.get(seq, 0) > max(0, pos + 1 - self.n_swa):
                return -1  # its window would miss cells (llama.cpp would attend to fewer)
            ends[seq] += 1
        if self.cells_used() + len(batch) > self.n_ctx:
            return 1
        if self.window_sized:  # every sequence's cells its next window no longer finds go
            for seq, cells in self._seqs.items():
                if cells:
                    lost = len(cells) + 1 - self.n_swa
                    self.swa_lost[seq] = max(self.swa_lost.get(seq, 0), lost)
        self._rows = []
        for token, _, seq, output in batch:
            cell = next(self._cells)
            self._cell_under[cell] = self.adapters
            self._seqs[seq].append((token, cell))
            if output:
                cells = self._seqs[seq]
                under = [self._cell_under[c] for _, c in cells]
                self._rows.append(history_logits([t for t, _ in cells], under))
            else:
                self._rows.append(np.empty(0, dtype=np.float32))
        return 0

    def new_sampler(
        self, params: SamplingParams, seed_offset: int, gbnf: str | None
    ) -> FakeSampler:
        return FakeSampler(self, params, seed_offset, gbnf)

    def logit_row(self, row: int) -> np.ndarray:
        assert self._rows[row].size, "row has no logits"
        return self._rows[row]

    def piece(self, token: int) -> bytes:
        if FIRST_LETTER <= token < FIRST_LETTER + 26:
            return bytes([ord("a") + token - FIRST_LETTER])
        return b"" if token in (EOS, BOS) else b" "

    def is_eog(self, token: int) -> bool:
        return token == EOS

    # ---- KV cache -----------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        cells = self._seqs[seq]
        if p0 <= 0 and p1 < 0:
            self.swa_lost.pop(seq, None)
        start = 0 if p0 < 0 else p0
        end = len(cells) if p1 < 0 else p1
        if end < len(cells) and start < end:
            return False  # a hole in the middle: llama.cpp refuses it for recurrent models too
        del cells[start:end]
        return True

    def seq_cp(self, src: int, dst: int) -> None:
        assert not self._seqs[dst], "copy onto a sequence that holds cells"
        self._seqs[dst] = list(self._seqs[src])
        if src in self.swa_lost:
            self.swa_lost[dst] = self.swa_lost[src]

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        cells = self._seqs[seq]
        if not cells:
            return (-1, -1)
        first = self.swa_lost.get(seq, 0)
        if self.window_sized:  # the sliding layers may hold none of its positions
            return (first if first < len(cells) else -1, len(cells) - 1)
        return (min(first, len(cells) - 1), len(cells) - 1)

    def save_window(self, seq: int, position: int) -> bytes | None:
        assert len(self._seqs[seq]) == position, "a window saved off the end of its sequence"
        first = max(0, position + 1 - self.n_swa)
        assert self.swa_lost.get(seq, 0) <= first, "a window saved with cells missing"
        return json.dumps([self.history(seq), first]).encode()

    def restore_window(self, seq: int, state: object) -> bool:
        tokens, first = json.loads(bytes(state))  # type: ignore[call-overload]
        assert self.history(seq) == tokens, "a window restored onto other tokens"
        self.swa_lost[seq] = first
        self.windows_restored += 1
        return True

    def save_sequence(self, seq: int) -> tuple[bytes, int] | None:
        cells = [[token, self._cell_under[cell]] for token, cell in self._seqs[seq]]
        state = json.dumps([cells, self.swa_lost.get(seq, 0)]).encode()
        self.sequences_saved += 1
        return state, len(state)

    def restore_sequence(self, seq: int, state: object) -> bool:
        assert not self._seqs[seq], "a sequence restored onto cells"
        cells, lost = json.loads(bytes(state))  # type: ignore[call-overload]
        if self.cells_used() + len(cells) > self.n_ctx:
            return False
        for token, under in cells:
            cell = next(self._cells)
            self._cell_under[cell] = tuple(tuple(pair) for pair in under)
            self._seqs[seq].append((token, cell))
        if lost:
            self.swa_lost[seq] = lost
        self.sequences_restored += 1
        return True

    def history(self, seq: int) -> list[int]:
        return [token for token, _ in self._seqs[seq]]

    # ---- prompts ------------------------------------------------------------------------

    def render(self, prompt: ChatPrompt) -> str:
        return " ".join(turn.content for turn in prompt.messages)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.tokenized_bytes += len(text)
        tokens = [FIRST_LETTER + ord(c) - ord("a") if "a" <= c <= "z" else SPACE for c in text]
        return [BOS, *tokens] if add_special and self.add_bos else tokens

    def detokenize(self, tokens: Sequence[int], *, special: bool) -> str:
        names = {BOS: "<bos>", EOS: "<eos>"} if special else {}
        return "".join(names.get(t) or self.piece(t).decode() for t in tokens)

    def check_grammar(self, gbnf: str) -> None:
        if gbnf == "unparsable":
            raise InvalidPrompt("The grammar could not be parsed; check its GBNF syntax.")

    # ---- scoring --------------------------------------------------------------------------

    def score_chunk(
        self, tokens: Sequence[int], start: int, outputs: Sequence[int]
    ) -> list[np.ndarray]:
        if self.fail_score:
            raise RuntimeError("scripted scoring failure")
        self.holds_score_context = True
        if start == 0:
            self._score_history = []
        assert start == len(self._score_history), "score chunk out of order"
        self.steps_under.append(self.adapters)
        rows = []
        for offset, token in enumerate(tokens):
            self._score_history.append(token)
            if offset in outputs:
                history = self._score_history
                rows.append(history_logits(history, [self.adapters] * len(history)))
        return rows

    def classify(self, tokens: Sequence[int]) -> float:
        raise NotImplementedError

    def release_score_context(self) -> None:
        self.holds_score_context = False

    holds_output_pages = False  # nothing native to hand back

    def time_steps(self, sizes: Sequence[int]) -> list[tuple[int, float]]:
        return []  # its decode times are not a machine's

    def release_output_pages(self) -> None:
        return

    idle_work_left = False  # its max_piece_bytes is known from the start

    def idle_work(self) -> None:
        return

    holds_compute_pages = False

    def release_compute_pages(self) -> None:
        return

    def reset(self) -> None:
        self.resets += 1
        self._seqs = {s: [] for s in range(self.n_seq)}

    def close(self) -> None:
        pass
