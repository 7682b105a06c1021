"""Checking text against a GBNF grammar with llama.cpp's own grammar engine (the one the
server samples with), independent of the server: the model's vocabulary alone is loaded."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import llama_cpp as lc


class GrammarCheck:
    """The vocabulary of a GGUF (`vocab`, `n_vocab`), for asking whether a grammar accepts a
    text."""

    def __init__(self, model_path: Path) -> None:
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self._model = lc.llama_model_load_from_file(str(model_path).encode(), params)
        if not self._model:
            raise RuntimeError(f"cannot load the vocabulary of {model_path}")
        self.vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self._one = (lc.llama_token_data * 1)()
        self._single = lc.llama_token_data_array(
            data=ctypes.cast(self._one, ctypes.POINTER(lc.llama_token_data)), size=1
        )

    def close(self) -> None:
        """Free the vocabulary."""
        lc.llama_model_free(self._model)

    def accepts(self, gbnf: str, text: str, *, complete: bool) -> bool:
        """Whether `grammar` accepts `text` as a whole answer (`complete`: the grammar may end
        there) or as the start of one. The text is fed as tokens; the grammar works on their
        characters, so any tokenization of the text gives the same verdict."""
        tokens = self._tokenize(text)
        grammar = lc.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        assert grammar, "the grammar does not parse"
        try:
            for token in tokens:
                if not self._allows(grammar, token):
                    return False
                lc.llama_sampler_accept(grammar, token)
            return not complete or self._allows(grammar, lc.llama_vocab_eos(self.vocab))
        finally:
            lc.llama_sampler_free(grammar)

    def _allows(self, grammar: object, token: int) -> bool:
        self._one[0].id = token
        self._one[0].logit = 1.0
        self._single.size = 1
        self._single.selected = -1
        lc.llama_sampler_apply(grammar, ctypes.byref(self._single))
        return not math.isinf(self._one[0].logit)

    def _tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buffer = (lc.llama_token * (len(data) + 8))()
        count = lc.llama_tokenize(self.vocab, data, len(data), buffer, len(buffer), False, False)
        assert count >= 0, "tokenize buffer too small"
        tokens = list(buffer[:count])
        assert self._detokenize(tokens) == data, "the text does not round-trip through tokens"
        return tokens

    def _detokenize(self, tokens: list[int]) -> bytes:
        out = bytearray()
        piece = ctypes.create_string_buffer(256)
        for token in tokens:
            size = lc.llama_token_to_piece(self.vocab, token, piece, len(piece), 0, False)
            out += piece.raw[:size]
        return bytes(out)
