"""camplib.dialogue.masking: padding is never trained even though pad == eos, the real
end-of-turn tokens are, and the masked loss equals a hand-computed one (and torch's)."""
import pytest
import torch
import torch.nn.functional as F

from camplib.dialogue.masking import IGNORE, masked_cross_entropy, pad_batch
from tests.support import assert_close

EOT = 9   # pad == eos, as in SmolLM2 and the tiny base


def test_pad_batch_labels_padding_and_real_end_of_turn():
    examples = [([1, 2, 3, EOT, 4], [0, 1, 1, 1, 0]), ([5, EOT], [1, 1])]
    b = pad_batch(examples, pad_id=EOT)
    assert b["input_ids"].tolist() == [[1, 2, 3, EOT, 4], [5, EOT, EOT, EOT, EOT]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b["labels"].tolist() == [[IGNORE, 2, 3, EOT, IGNORE], [5, EOT, IGNORE, IGNORE, IGNORE]]
    cut = pad_batch(examples, pad_id=EOT, max_len=3)
    assert cut["labels"].tolist() == [[IGNORE, 2, 3], [5, EOT, IGNORE]]


def test_pad_batch_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        pad_batch([], 0)
    with pytest.raises(ValueError, match="mask entries"):
        pad_batch([([1, 2], [1])], 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_cross_entropy_by_hand_and_against_torch(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=gen, dtype=dtype)
    labels = torch.randint(0, 11, (3, 6), generator=gen)
    labels[torch.rand(3, 6, generator=gen) < 0.5] = IGNORE
    labels[0, 2] = 4
    logp = logits.double().log_softmax(-1)
    by_hand = torch.stack([-logp[b, t - 1, labels[b, t]] for b in range(3) for t in range(1, 6)
                           if labels[b, t] != IGNORE]).mean()
    got = masked_cross_entropy(logits, labels)
    assert got.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert_close("masked CE vs by hand", got.double(), by_hand, atol=tol, rtol=tol)
    torch_ref = F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=IGNORE)
    assert_close("masked CE vs torch", got, torch_ref, atol=tol, rtol=tol)


def test_masked_cross_entropy_shape_error():
    with pytest.raises(ValueError, match="logits"):
        masked_cross_entropy(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))
