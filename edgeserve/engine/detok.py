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

    `push` returns the text that is safe to emit and the stop string found (None while none
    is); once one is found, the text from the stop string on is dropped.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Add `text`; return (text safe to emit now, the stop string found or None). Of
        several, the one that starts first wins (then the first given)."""
        if not self._stops:
            return text, None
        buf = self._held + text
        found = [(at, n) for n, at in enumerate(buf.find(s) for s in self._stops) if at >= 0]
        if found:
            cut, which = min(found)
            self._held = ""
            return buf[:cut], self._stops[which]
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

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
