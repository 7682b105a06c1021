"""A --draft-model's context in llama.cpp (`DraftContext`, see ports.py and draft_model.py)."""

from __future__ import annotations

import logging

import llama_cpp.llama_cpp as lc

from edgeserve.engine.llama.batch import TokenBatch
from edgeserve.engine.llama.model import LoadedModel, ModelLoadError
from edgeserve.engine.ports import DecodeLimits
from edgeserve.engine.types import EngineConfig

log = logging.getLogger("edgeserve.engine")

# Token texts compared between a draft model and its target (spread over the vocabulary).
VOCAB_SAMPLES = 1024


class LlamaDraftContext:
    """`DraftContext` over a --draft-model: its own model and generation context (same
    n_ctx, sequences, threads and GPU offload as the target) and batch. Refused at load unless
    its vocabulary is the target's: the same size, special tokens and token texts."""

    def __init__(self, config: EngineConfig, limits: DecodeLimits, target: LoadedModel) -> None:
        self.model = LoadedModel(config, limits, role="draft")
        try:
            mismatch = vocab_mismatch(self.model, target)
            if mismatch:
                raise ModelLoadError(
                    f"{self.model.path} cannot draft for {target.path}: {mismatch}"
                )
        except BaseException:
            self.model.close()
            raise
        self.n_seq = config.parallel
        self.batch = TokenBatch(limits.draft_batch)
        log.info("speculative decoding drafts with %s", self.model.path)

    def decode(self) -> int:
        """Decode the batch in the draft context (see DraftContext.decode)."""
        return self.batch.decode(self.model.ctx)

    def greedy(self, row: int) -> int:
        """The arg-max token of output row `row`."""
        return int(self.model.logit_row(self.model.ctx, row).argmax())

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of draft sequence `seq`."""
        return self.model.seq_rm(seq, p0, p1)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(first, last) stored position of draft sequence `seq`; (-1, -1) when empty."""
        return self.model.seq_pos_range(seq)

    def clear(self) -> None:
        """Empty every draft sequence."""
        lc.llama_memory_clear(self.model.memory, True)

    def close(self) -> None:
        """Free the batch, the context and the model."""
        self.batch.free()
        self.model.close()


def vocab_mismatch(draft: LoadedModel, target: LoadedModel) -> str | None:
    """How `draft`'s vocabulary differs from `target`'s (None when it does not): its size,
    BOS/EOS and whether BOS is added, then the text of VOCAB_SAMPLES tokens spread over it."""
    if draft.n_vocab != target.n_vocab:
        return f"its vocabulary has {draft.n_vocab} tokens, the model's {target.n_vocab}"
    specials = (
        ("BOS", draft.bos, target.bos),
        ("EOS", lc.llama_vocab_eos(draft.vocab), lc.llama_vocab_eos(target.vocab)),
        ("add BOS", draft.add_bos, target.add_bos),
    )
    for name, mine, theirs in specials:
        if mine != theirs:
            return f"its {name} is {mine}, the model's {theirs}"
    stride = max(1, target.n_vocab // VOCAB_SAMPLES)
    for token in [*range(0, target.n_vocab, stride), target.n_vocab - 1]:
        mine, theirs = draft.piece(token, special=True), target.piece(token, special=True)
        if mine != theirs:
            return f"its token {token} is {mine!r}, the model's {theirs!r}"
    return None
