"""A subprocess that compiles grammars with llama.cpp, as the server does (edgeserve's
`grammar_sampler` on the model's vocabulary), then walks each a few tokens (candidates checked
and one accepted per step, as sampling does). llama.cpp may abort the process on a grammar;
running here, that ends only this process, and the fuzz test sees it.

Run as `python -m tests.fuzz.grammar_worker MODEL`. One JSON request per stdin line,
`{"gbnf": ..., "seed": ..., "steps": ...}`; one JSON answer per stdout line,
`{"compiled": bool, "steps": n}` (the tokens accepted)."""

from __future__ import annotations

import ctypes
import json
import math
import random
import string
import sys
from typing import Any

import llama_cpp as lc

from edgeserve.engine.llama.sampling import grammar_sampler
from edgeserve.errors import InvalidPrompt

RANDOM_CANDIDATES = 64


class Walker:
    """The vocabulary of a model, and the candidates a walk offers each grammar step: every
    printable ASCII character's token, and RANDOM_CANDIDATES random tokens."""

    def __init__(self, model_path: str) -> None:
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self.model = lc.llama_model_load_from_file(model_path.encode(), params)
        if not self.model:
            raise RuntimeError(f"cannot load the vocabulary of {model_path}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.characters = [
            token for char in string.printable if (token := self._single(char)) is not None
        ]
        self.characters.append(lc.llama_vocab_eos(self.vocab))
        size = len(self.characters) + RANDOM_CANDIDATES
        self._data = (lc.llama_token_data * size)()
        self._array = lc.llama_token_data_array(
            data=ctypes.cast(self._data, ctypes.POINTER(lc.llama_token_data)), size=size
        )

    def _single(self, char: str) -> int | None:
        data = char.encode()
        buffer = (lc.llama_token * 8)()
        count = lc.llama_tokenize(self.vocab, data, len(data), buffer, len(buffer), False, False)
        return buffer[0] if count == 1 else None

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Compile the request's grammar and walk it (see the module docstring)."""
        try:
            grammar = grammar_sampler(self.vocab, request["gbnf"])
        except InvalidPrompt:
            return {"compiled": False, "steps": 0}
        rng = random.Random(request["seed"])
        try:
            for step in range(request["steps"]):
                allowed = self._allowed(grammar, rng)
                if not allowed:
                    return {"compiled": True, "steps": step}
                lc.llama_sampler_accept(grammar, rng.choice(allowed))
            return {"compiled": True, "steps": request["steps"]}
        finally:
            lc.llama_sampler_free(grammar)

    def _allowed(self, grammar: Any, rng: random.Random) -> list[int]:
        """The candidates `grammar` accepts next (not the end of generation)."""
        tokens = self.characters + [rng.randrange(self.n_vocab) for _ in range(RANDOM_CANDIDATES)]
        for slot, token in enumerate(tokens):
            self._data[slot].id = token
            self._data[slot].logit = 0.0
            self._data[slot].p = 0.0
        self._array.size = len(tokens)
        self._array.selected = -1
        self._array.sorted = False
        lc.llama_sampler_apply(grammar, ctypes.byref(self._array))
        eos = lc.llama_vocab_eos(self.vocab)
        size = self._array.size
        return [
            self._data[slot].id
            for slot in range(size)
            if not math.isinf(self._data[slot].logit) and self._data[slot].id != eos
        ]


def main() -> None:
    """Answer grammar requests until stdin closes."""
    walker = Walker(sys.argv[1])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(walker.run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
