"""Token ids to text, incrementally, for streaming: each `push` returns only text that is final.

Two things may not be sent yet: a character cut in the middle of its UTF-8 bytes (byte-level
tokens; decode shows U+FFFD until the rest arrives) and text that could be the start of a stop
string (once "\\n\\nUser:" is complete, none of it may have been sent).
"""
from __future__ import annotations

__all__ = ["Detokenizer"]


class Detokenizer:
    def __init__(self, decode, stops: list[str] = ()):
        self.decode, self.stops = decode, [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = 0            # characters already returned
        self.stopped = False     # a stop string was found: the text ends before it

    def _text(self) -> tuple[str, int]:
        """The text so far (cut at a stop string) and how many trailing characters to hold back."""
        text = self.decode(self.ids)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            return text[:min(cuts)], 0
        hold = len(text) - len(text.rstrip("\ufffd"))
        for s in self.stops:
            hold = max(hold, next((k for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), 0))
        return text, hold

    def push(self, token: int) -> str:
        self.ids.append(token)
        text, hold = self._text()
        end = max(self.sent, len(text) - hold)
        delta, self.sent = text[self.sent:end], end
        return delta

    def flush(self) -> str:
        """The rest, at the end of the sequence (a cut character stays U+FFFD)."""
        text, _ = self._text()
        delta, self.sent = text[self.sent:], len(text)
        return delta
