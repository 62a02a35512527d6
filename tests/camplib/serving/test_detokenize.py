"""Streaming text: a character split across byte tokens and the start of a stop string are held
back until they are certain; the text ends before the stop string."""
from camplib.serving.detokenize import Detokenizer
from camplib.tokenizer import ByteBPE


def _push_all(text_bytes, stops=()):
    bpe = ByteBPE([])
    d = Detokenizer(bpe.decode, list(stops))
    deltas = [d.push(b) for b in text_bytes]
    return deltas, d.flush(), d.stopped


def test_a_multibyte_character_is_sent_whole():
    deltas, rest, _ = _push_all("né".encode())      # é is 2 bytes
    assert deltas == ["n", "", "é"] and rest == ""


def test_stop_string_is_held_back_then_cut():
    deltas, rest, stopped = _push_all(b"ab\nUser: hi", stops=["\nUser:"])
    assert "".join(deltas) + rest == "ab" and stopped
    deltas, rest, stopped = _push_all(b"ab\nUs", stops=["\nUser:"])   # looked like a stop, was not
    assert deltas[:2] == ["a", "b"] and "".join(deltas) == "ab" and rest == "\nUs" and not stopped
