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


def test_streamed_text_is_the_whole_decode_in_every_prefix():
    """Each push decodes a window, not everything: the text sent so far (plus what is held back)
    must still be the decode of all ids so far, with multi-byte characters split across tokens
    and a tokenizer that drops the leading space of whatever it decodes (SentencePiece's way)."""
    import random
    text = " naïve café — 東京 ünïcödé 🙂 emoji and plain words, again: naïve café 🙂"
    bpe = ByteBPE.train([text], vocab_size=280)
    rng = random.Random(0)
    for decode in (bpe.decode, lambda ids: bpe.decode(ids).removeprefix(" ")):
        for case in range(20):
            ids = bpe.encode(text) if case == 0 else [rng.randrange(bpe.vocab_size) for _ in range(rng.randrange(1, 60))]
            d, sent = Detokenizer(decode), ""
            for n, tok in enumerate(ids, 1):
                sent += d.push(tok)
                whole = decode(ids[:n])
                assert whole.startswith(sent) and whole[len(sent):].strip("\ufffd") == "", (case, n, sent, whole)
            assert sent + d.flush() == decode(ids), case
