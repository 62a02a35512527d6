"""Token ids to text, incrementally, for streaming: each `push` returns only text that is final.

Two things may not be sent yet: a character cut in the middle of its UTF-8 bytes (byte-level
tokens; decode shows U+FFFD until the rest arrives) and text that could be the start of a stop
string (once "\\n\\nUser:" is complete, none of it may have been sent).

Each push decodes a short window of tokens, not the whole answer again (that cost grows with
every token: ~35 us per push at 128 tokens with SmolLM2's tokenizer, and an answer of 2,000
tokens would spend ~1 s of the server's one core in decode). The text of the new tokens is
decode(window + new) minus decode(window), with the window starting a few tokens back at a
character boundary, so a tokenizer that drops a leading space at the start of a decode (or joins
bytes across tokens) gives the same text as decoding everything (vLLM and TGI do the same).
"""
from __future__ import annotations

__all__ = ["Detokenizer"]


class Detokenizer:
    def __init__(self, decode, stops: list[str] = ()):
        self.decode, self.stops = decode, [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""           # the text of ids[:done], which ends at a whole character
        self.done = 0
        self.window = 0          # where the next decode starts: the boundary before `done`
        self.sent = 0            # characters already returned
        self.stopped = False     # a stop string was found: the text ends before it

    def _tail(self) -> str:
        """The text of ids[done:], decoded in context from `window`; moves the boundary forward
        when it ends at a whole character."""
        head = self.decode(self.ids[self.window:self.done])
        tail = self.decode(self.ids[self.window:])[len(head):]
        if tail and not tail.endswith("\ufffd"):
            self.text += tail
            self.window, self.done, tail = self.done, len(self.ids), ""
        return tail

    def _view(self) -> tuple[str, int]:
        """The text so far (cut at a stop string) and how many trailing characters to hold back."""
        tail = self._tail()   # (first: it may extend self.text)
        text = self.text + tail
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
        text, hold = self._view()
        end = max(self.sent, len(text) - hold)
        delta, self.sent = text[self.sent:end], end
        return delta

    def flush(self) -> str:
        """The rest, at the end of the sequence (a cut character stays U+FFFD)."""
        text, _ = self._view()
        delta, self.sent = text[self.sent:], len(text)
        return delta
