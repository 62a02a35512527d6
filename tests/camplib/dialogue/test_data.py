"""camplib.dialogue.data: deterministic conversations whose states carry slots across turns, a
held-out split with unseen phrasings, and a parser that never raises."""
import pytest

from camplib.dialogue.data import EMPTY, SLOTS, make_dialogues, parse_state, state_line
from camplib.intents import phrasings


def test_deterministic_alternating_and_seeded():
    a, b = make_dialogues(20, 10, seed=3), make_dialogues(20, 10, seed=3)
    assert a == b, "same seed, different data"
    assert make_dialogues(20, 10, seed=4) != a, "the seed changes nothing"
    for conv in a["train"] + a["test"]:
        assert 4 <= len(conv) <= 6, len(conv)
        assert [m["role"] for m in conv] == ["user", "assistant"] * (len(conv) // 2)


def test_slots_are_carried_across_turns():
    """Once a slot is known it stays in every later state (the intent may change)."""
    for conv in make_dialogues(200, 0, seed=1)["train"]:
        states = [parse_state(m["content"]) for m in conv if m["role"] == "assistant"]
        for earlier, later in zip(states, states[1:]):
            for slot in ("order", "product", "address"):
                if earlier[slot] != EMPTY:
                    assert later[slot] == earlier[slot], (slot, conv)
        assert all(set(s) == set(SLOTS) for s in states)


def test_held_out_openings_are_unseen_phrasings():
    d = make_dialogues(100, 100, seed=0)
    openings = lambda split: {c[0]["content"].lower() for c in d[split]}  # noqa: E731
    assert not openings("train") & openings("test"), "a held-out opening request is in training"
    held = [t.split("{")[0].lower() for i in ("track_order", "refund", "change_address") for t in phrasings(i, held_out=True)]
    assert any(c[0]["content"].lower().startswith(h) for c in d["test"] for h in held if h)


@pytest.mark.parametrize("text, want", [
    ("intent: refund; order: 482; product: sofa; address: -", {"intent": "refund", "order": "482", "product": "sofa", "address": "-"}),
    ("intent: refund; order: 4\nmore", {"intent": "refund", "order": "4"}),
    ("garbage without structure", {}),
    ("", {}),
    (None, {}),
    ("intent: a; intent: b; bogus: 1", {"intent": "a"}),
])
def test_parse_state_never_raises(text, want):
    assert parse_state(text) == want


def test_state_line_round_trips():
    state = {"intent": "change_address", "order": "12", "product": "kettle", "address": "3 Oak Lane"}
    assert parse_state(state_line(state)) == state
    assert parse_state(state_line({"intent": "refund"}))["order"] == EMPTY


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="n_train"):
        make_dialogues(0, 5)
