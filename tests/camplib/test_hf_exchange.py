"""camplib.hf: weights exchanged with transformers' GPT-2 and Llama give the same logits and
the same greedy continuations. Models are tiny and randomly initialised (no downloads)."""
import pytest
import torch

from autograder.checks import check_close
from camplib.generate import generate
from camplib.hf import from_hf, to_hf
from camplib.model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.parity

# fp32 logits of size up to ~7: measured differences are up to ~5e-6 (equivalent maths, other
# summation orders); any wrong weight, transpose or convention gives differences of order 0.1-1.
ATOL, RTOL = 1e-5, 1e-5
# fp64 (GPT-2 only; HF Llama computes RMSNorm and softmax in fp32 even for fp64 models, which
# limits that comparison to ~2e-6): measured ~5e-15.
ATOL64, RTOL64 = 1e-12, 1e-10
VOCAB = 101


def hf_gpt2(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
               embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
               initializer_range=0.2, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**cfg, **overrides})).eval()


def hf_llama(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, rope_theta=500.0,
               rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, initializer_range=0.2,
               attn_implementation="eager")
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, **overrides})).eval()


def randomize_norms(hf_model):
    """HF initialises norm weights to 1 and biases to 0, which would hide a swapped or missing
    norm tensor; give them random values so every tensor's mapping is tested."""
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("weight") else 0.1 * torch.randn_like(p))
    return hf_model


HF_MODELS = {
    "gpt2": lambda: hf_gpt2(),
    "gpt2_untied_exact_gelu": lambda: hf_gpt2(tie_word_embeddings=False, activation_function="gelu", n_inner=80),
    "llama_gqa_untied": lambda: hf_llama(),
    "llama_gqa_tied": lambda: hf_llama(tie_word_embeddings=True),
    "llama_mha_bias": lambda: hf_llama(num_key_value_heads=4, attention_bias=True, mlp_bias=True),
}

PROMPT = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name", HF_MODELS)
def test_from_hf_logits_match(name):
    hf = randomize_norms(HF_MODELS[name]())
    ours = from_hf(hf)
    assert not ours.training
    assert ours.num_parameters() == hf.num_parameters()
    assert (ours.lm_head.weight is ours.tok_emb.weight) == hf.config.tie_word_embeddings
    with torch.no_grad():
        expected = hf(PROMPT).logits
        logits, _ = ours(PROMPT)
    check_close(f"logits from {name}", logits, expected, atol=ATOL, rtol=RTOL)


def test_from_hf_gpt2_fp64():
    hf = randomize_norms(hf_gpt2(tie_word_embeddings=False)).double()
    ours = from_hf(hf)
    assert ours.lm_head.weight.dtype == torch.float64
    with torch.no_grad():
        check_close("fp64 GPT-2 logits", ours(PROMPT)[0], hf(PROMPT).logits, atol=ATOL64, rtol=RTOL64)


def test_from_hf_reads_the_config():
    cfg = from_hf(hf_llama()).config
    assert (cfg.rope_theta, cfg.n_head, cfg.kv_heads, cfg.ff_dim, cfg.norm_eps) == (500.0, 4, 2, 96, 1e-6)
    cfg = from_hf(hf_gpt2(n_inner=80, layer_norm_epsilon=1e-4)).config
    assert (cfg.ff_dim, cfg.norm_eps, cfg.gelu_approximate, cfg.max_seq_len) == (80, 1e-4, "tanh", 64)


@pytest.mark.parametrize("cfg", [
    GPTConfig.gpt2_style(vocab_size=VOCAB, max_seq_len=64),
    GPTConfig.gpt2_style(vocab_size=VOCAB, max_seq_len=64, tie_embeddings=False, gelu_approximate="none"),
    GPTConfig.llama_style(vocab_size=VOCAB, max_seq_len=64, rope_theta=1000.0),
    GPTConfig.llama_style(vocab_size=VOCAB, max_seq_len=64, n_kv_head=1, tie_embeddings=True, bias=True),
], ids=["gpt2", "gpt2_untied", "llama", "llama_mqa_tied_bias"])
def test_to_hf_round_trip(cfg):
    torch.manual_seed(0)
    ours = GPT(cfg).eval()
    with torch.no_grad():  # random norms/biases too (see randomize_norms)
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf = to_hf(ours)
    assert not hf.training and hf.num_parameters() == ours.num_parameters()
    with torch.no_grad():
        check_close("HF logits of our weights", hf(PROMPT).logits, ours(PROMPT)[0], atol=ATOL, rtol=RTOL)
    back = from_hf(hf)
    for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name  # ours -> HF -> ours is lossless


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa_untied", "llama_gqa_tied"])
def test_greedy_generation_matches_hf_generate(name):
    hf = randomize_norms(HF_MODELS[name]())
    ours = from_hf(hf)
    expected = hf.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), do_sample=False,
                           max_new_tokens=20, pad_token_id=0)
    got = generate(ours, PROMPT, 20)
    assert torch.equal(got, expected), f"ours {got.tolist()}\nhf   {expected.tolist()}"
    assert len(got[0, 9:].unique()) > 1  # a real continuation, not one token repeated


def test_rope_tables_match_llama():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = hf_llama()
    hf_rope = LlamaRotaryEmbedding(hf.config)
    x = torch.randn(1, 64, 16)
    cos, sin = hf_rope(x, torch.arange(64)[None])
    ours = from_hf(hf).blocks[0].attn.rope
    assert torch.equal(ours.cos, cos[0]) and torch.equal(ours.sin, sin[0])


def test_unrepresentable_configs_raise():
    with pytest.raises(ValueError, match="learned"):
        to_hf(GPT(GPTConfig.llama_style(pos="learned")))
    with pytest.raises(ValueError, match="bias"):
        to_hf(GPT(GPTConfig.gpt2_style(bias=False)))
    with pytest.raises(ValueError, match="GQA"):
        to_hf(GPT(GPTConfig.gpt2_style(n_kv_head=2)))
    with pytest.raises(ValueError, match="scaling"):
        from_hf(hf_llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}))
