"""A student distilled from a teacher beats the same student trained alone, seed after seed
(lab a08's claim, at the lab's CI sizes: byte-level stdlib text, a teacher trained on all of it,
students on 16 blocks)."""
import pytest
import torch

from camplib.compress.distill_run import train_lm, validation_loss
from camplib.data import pack, read_corpus, split_files, stdlib_files
from camplib.model import GPT, GPTConfig

L = 32
MARGIN = 0.03      # nats/token; measured margins at these sizes: 0.084-0.198 over 5 seeds


@pytest.fixture(scope="module")
def corpus():
    train, val = split_files(stdlib_files())
    blocks = pack([list(t.encode()) for t in read_corpus(train[:20])], block_size=L, eos_id=0)
    val_blocks = pack([list(t.encode()) for t in read_corpus(val[:4])], block_size=L, eos_id=0)[:256]
    torch.manual_seed(0)
    teacher = GPT(GPTConfig(vocab_size=256, n_layer=2, n_head=4, d_model=64, max_seq_len=L))
    train_lm(teacher, blocks, 60, batch_size=32)
    return blocks, val_blocks, teacher


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distilled_student_beats_the_student_trained_alone(corpus, seed):
    blocks, val_blocks, teacher = corpus
    small = blocks[torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed))[:16]]
    losses = {}
    for name, t in [("alone", None), ("distilled", teacher)]:
        torch.manual_seed(seed)
        student = GPT(GPTConfig(vocab_size=256, n_layer=1, n_head=2, d_model=32, max_seq_len=L))
        train_lm(student, small, 40, teacher=t, temperature=1.0, alpha=0.9, seed=seed)
        losses[name] = validation_loss(student, val_blocks)
    assert losses["distilled"] < losses["alone"] - MARGIN, (seed, losses, validation_loss(teacher, val_blocks))


def test_train_lm_refuses_nothing_to_train_on():
    model = GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=1, d_model=8, max_seq_len=8))
    with pytest.raises(ValueError, match="at least one block"):
        train_lm(model, torch.zeros(0, 9, dtype=torch.long), 1)
