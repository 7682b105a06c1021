"""Turning token bytes into safe text: UTF-8 reassembly and stop strings with hold-back."""

from __future__ import annotations

import codecs


class Utf8Assembler:
    """Accepts token byte pieces and releases only complete UTF-8 characters.

    A token may end in the middle of a multi-byte character; those bytes wait for the next
    token. Invalid sequences become U+FFFD instead of raising.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        """Return the text completed by `piece`."""
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """Return whatever is left (an unfinished character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text, holding back a tail that may start one.

    `push` returns the text that is safe to emit and whether a stop string was found; once
    one is found, the text from the stop string on is dropped.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add `text`; return (text safe to emit now, stop string found)."""
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Release the held-back tail when the sequence ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:k]):
                    best = k
                    break
        return best
