"""camplib.prompt_tuning: prefix tuning on camplib's GPT equals peft's PrefixTuning on the same
transformers Llama (converted with camplib.hf.from_hf) holding the same prefix tensor: logits
and the prefix's gradient. Tiny random models, fp32."""
import pytest
import torch

from camplib.hf import from_hf
from camplib.prompt_tuning import PrefixTuning
from tests.support import assert_close

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.parity

# fp32 logits of order 1: camplib vs transformers differ by ~1e-6 (summation order), as in test_hf_exchange
ATOL, RTOL = 1e-5, 1e-5


def hf_llama(n_kv=4, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                                   num_key_value_heads=n_kv, vocab_size=50, max_position_embeddings=32,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   initializer_range=0.2, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


def twins(n_virtual=3, n_kv=4):
    hf = hf_llama(n_kv)
    ours = PrefixTuning(from_hf(hf).eval(), n_virtual)
    theirs = peft.get_peft_model(hf, peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=n_virtual))
    with torch.no_grad():
        theirs.prompt_encoder["default"].embedding.weight.copy_(ours.prefix.weight)
    return ours, theirs.eval()


@pytest.mark.parametrize("n_kv", [4, 2], ids=["mha", "gqa"])
def test_logits_and_prefix_gradient_equal_peft(n_kv):
    ours, theirs = twins(n_kv=n_kv)
    idx = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    logits, _ = ours(idx)
    ref = theirs(input_ids=idx, attention_mask=torch.ones_like(idx)).logits
    assert_close("logits with the prefix vs peft PrefixTuning", logits, ref, atol=ATOL, rtol=RTOL)
    plain, _ = ours.model(idx)
    assert (plain - logits).abs().max() > 1e-3, "the prefix changed nothing"
    g = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    logits.backward(g)
    ref.backward(g)
    assert_close("gradient of the prefix vs peft", ours.prefix.weight.grad,
                 theirs.prompt_encoder["default"].embedding.weight.grad, atol=ATOL, rtol=RTOL)


def test_only_the_prefix_trains_and_training_lowers_the_loss():
    ours, _ = twins(n_virtual=4)
    assert [n for n, p in ours.named_parameters()] == ["prefix.weight"]
    assert not any(p.requires_grad for p in ours.model.parameters())
    frozen = {k: v.clone() for k, v in ours.model.state_dict().items()}
    seq = torch.randint(0, 50, (4, 9), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.Adam(ours.parameters(), lr=0.05)
    losses = []
    for _ in range(15):
        _, loss = ours(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
    for k, v in ours.model.state_dict().items():
        assert torch.equal(v, frozen[k]), f"{k} changed: the model must stay frozen"


def test_bad_input():
    ours, _ = twins()
    with pytest.raises(ValueError, match="n_virtual"):
        PrefixTuning(ours.model, 0)
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        ours(torch.zeros(1, 31, dtype=torch.long))
