"""A model's vocabulary in llama.cpp: tokenizing, token pieces and special tokens."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import llama_cpp.llama_cpp as lc

# Tokens one slice of the longest-piece scan reads (~5 ms on one core): what an idle engine
# does between looks at its inbox.
SCAN_SLICE = 4096


class Vocabulary:
    """llama.cpp's vocabulary of one model (`vocab`, its native handle). Every method is safe
    on any thread: llama.cpp's tokenizer only reads the vocabulary."""

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab
        self.n_vocab = lc.llama_vocab_n_tokens(vocab)
        self.add_bos = bool(lc.llama_vocab_get_add_bos(vocab))
        self.bos = lc.llama_vocab_bos(vocab)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}  # is_eog's answers so far
        # The longest-piece scan: tokens read so far, the longest piece among them.
        self._scan_lock = threading.Lock()
        self._scanned = 0
        self._longest = 1

    def token_text(self, token: int) -> str:
        """The text of a special token such as BOS or EOS ("" for none)."""
        if token < 0:
            return ""
        return self.piece(token, special=True).decode("utf-8", "replace")

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Tokenize `text`; `add_special` adds BOS/EOS as the model's metadata says."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes a token stands for (cached; special tokens render as "" unless asked).
        Safe on any thread: a miss reads the vocabulary into a buffer of its own."""
        key = token if not special else -token - 1
        cached = self._pieces.get(key)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(256)
        n = lc.llama_token_to_piece(self.vocab, token, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        out = buf.raw[:n]
        self._pieces[key] = out
        return out

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <end_of_turn> …). Cached: asked for
        every generated token, llama.cpp's answer costs a call that lets the GIL go."""
        known = self._eog.get(token)
        if known is None:
            known = self._eog[token] = bool(lc.llama_vocab_is_eog(self.vocab, token))
        return known

    @property
    def pieces_unscanned(self) -> bool:
        """True until every token's piece has been read for `max_piece_bytes`."""
        return self._scanned < self.n_vocab

    def scan_pieces(self, count: int = SCAN_SLICE) -> None:
        """Read the next `count` tokens' pieces into the longest-piece scan: the engine does
        it a slice at a time while idle, so that no request waits for the whole scan."""
        with self._scan_lock:
            self._scan(count)

    def max_piece_bytes(self) -> int:
        """The longest token's bytes (special tokens as text): a prompt of B bytes has at
        least B / this many tokens. Reads whatever the idle engine has not scanned yet."""
        with self._scan_lock:
            self._scan(self.n_vocab)
            return self._longest

    def _scan(self, count: int) -> None:
        end = min(self.n_vocab, self._scanned + count)
        if end == self._scanned:
            return
        buf = ctypes.create_string_buffer(1024)
        longest = self._longest
        for token in range(self._scanned, end):
            n = lc.llama_token_to_piece(self.vocab, token, buf, 1024, 0, True)
            longest = max(longest, abs(n))
        self._longest, self._scanned = longest, end
