"""Weights exchanged with Hugging Face `transformers`: GPT2LMHeadModel and LlamaForCausalLM.

Loading a trusted implementation's weights into our model and getting the same logits is the
strongest test the course has that the model is right. `transformers` is imported inside the
functions so that `import camplib` stays light.

Layout notes: HF GPT-2 uses `Conv1D` layers that store weights as (in, out), the transpose of
nn.Linear, and a fused `c_attn` (q, k, v); Llama has separate q/k/v projections that we fuse
into one `qkv` Linear, and its RoPE uses the same half-split convention as camplib.rope.
"""
from __future__ import annotations

import torch

from camplib.model import GPT, GPTConfig

__all__ = ["from_hf", "to_hf", "config_from_hf", "config_to_hf"]

_GPT2_ACT = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


def _rope_theta(hf_config) -> float:
    """transformers >= 5 keeps theta in config.rope_parameters (and aliases rope_scaling to it);
    older versions use config.rope_theta, with config.rope_scaling for scaled variants."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported (only plain RoPE)")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    return 10000.0 if theta is None else float(theta)


def config_from_hf(hf_config) -> GPTConfig:
    """The GPTConfig equivalent to a GPT2Config or LlamaConfig (dropout set to 0)."""
    c = hf_config
    if c.model_type == "gpt2":
        if c.activation_function not in _GPT2_ACT:
            raise ValueError(f"GPT-2 activation {c.activation_function!r} is not supported")
        if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx or c.add_cross_attention:
            raise ValueError("GPT-2 attention variants (unscaled, scaled by layer, cross) are not supported")
        return GPTConfig(vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head, d_model=c.n_embd,
                         d_ff=c.n_inner, max_seq_len=c.n_positions, norm="layernorm", mlp="gelu",
                         gelu_approximate=_GPT2_ACT[c.activation_function], pos="learned",
                         tie_embeddings=c.tie_word_embeddings, bias=True,
                         norm_eps=c.layer_norm_epsilon, dropout=0.0)
    if c.model_type == "llama":
        if c.hidden_act != "silu":
            raise ValueError(f"Llama activation {c.hidden_act!r} is not supported (only silu)")
        if getattr(c, "head_dim", None) not in (None, c.hidden_size // c.num_attention_heads):
            raise ValueError(f"head_dim={c.head_dim} != hidden_size / num_attention_heads is not supported")
        if bool(getattr(c, "attention_bias", False)) != bool(getattr(c, "mlp_bias", False)):
            raise ValueError("attention_bias != mlp_bias is not supported (GPTConfig has one bias flag)")
        return GPTConfig(vocab_size=c.vocab_size, n_layer=c.num_hidden_layers, n_head=c.num_attention_heads,
                         n_kv_head=c.num_key_value_heads or c.num_attention_heads, d_model=c.hidden_size,
                         d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings, norm="rmsnorm",
                         mlp="swiglu", pos="rope", rope_theta=_rope_theta(c),
                         tie_embeddings=c.tie_word_embeddings, bias=bool(getattr(c, "attention_bias", False)),
                         norm_eps=c.rms_norm_eps, dropout=0.0)
    raise ValueError(f"model_type {c.model_type!r} is not supported (gpt2, llama)")


def config_to_hf(cfg: GPTConfig):
    """The GPT2Config or LlamaConfig equivalent to `cfg`; ValueError if neither can express it."""
    import transformers

    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings,
                  bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    if (cfg.norm, cfg.mlp, cfg.pos) == ("layernorm", "gelu", "learned"):
        if not cfg.bias:
            raise ValueError("GPT-2 cannot represent bias=False (it always has biases)")
        if cfg.kv_heads != cfg.n_head:
            raise ValueError("GPT-2 cannot represent n_kv_head != n_head (it has no GQA)")
        act = "gelu_new" if cfg.gelu_approximate == "tanh" else "gelu"
        return transformers.GPT2Config(n_positions=cfg.max_seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layer,
                                       n_head=cfg.n_head, n_inner=cfg.ff_dim, activation_function=act,
                                       layer_norm_epsilon=cfg.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, **common)
    if (cfg.norm, cfg.mlp, cfg.pos) == ("rmsnorm", "swiglu", "rope"):
        if cfg.rope_pairing != "half":
            raise ValueError("transformers' Llama pairs RoPE features half-split: convert the model first "
                             "with camplib.model.convert_rope_pairing(model, 'half')")
        return transformers.LlamaConfig(hidden_size=cfg.d_model, intermediate_size=cfg.ff_dim,
                                        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
                                        num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_seq_len,
                                        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, hidden_act="silu",
                                        attention_bias=cfg.bias, mlp_bias=cfg.bias, attention_dropout=0.0,
                                        **common)
    raise ValueError(f"no transformers model has norm={cfg.norm!r}, mlp={cfg.mlp!r}, pos={cfg.pos!r}: "
                     "use layernorm+gelu+learned (GPT-2) or rmsnorm+swiglu+rope (Llama)")


def _gpt2_names(cfg: GPTConfig) -> list[tuple[str, str, bool]]:
    """(our name, HF name, transpose?) for every GPT-2 tensor; Conv1D weights need transposing."""
    names = [("tok_emb.weight", "transformer.wte.weight", False),
             ("pos_emb.weight", "transformer.wpe.weight", False),
             ("ln_f.weight", "transformer.ln_f.weight", False), ("ln_f.bias", "transformer.ln_f.bias", False)]
    for i in range(cfg.n_layer):
        ours, hf = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in [("ln1", "ln_1"), ("ln2", "ln_2")]:
            names += [(f"{ours}{a}.{p}", f"{hf}{b}.{p}", False) for p in ("weight", "bias")]
        for a, b in [("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                     ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")]:
            names += [(f"{ours}{a}.weight", f"{hf}{b}.weight", True), (f"{ours}{a}.bias", f"{hf}{b}.bias", False)]
    return names


def _llama_names(cfg: GPTConfig) -> list[tuple[str, str]]:
    """(our name, HF name) for every Llama tensor except q/k/v, which are fused (see below)."""
    names = [("tok_emb.weight", "model.embed_tokens.weight"), ("ln_f.weight", "model.norm.weight")]
    params = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layer):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        names += [(f"{ours}ln1.weight", f"{hf}input_layernorm.weight"),
                  (f"{ours}ln2.weight", f"{hf}post_attention_layernorm.weight")]
        for a, b in [("attn.proj", "self_attn.o_proj"), ("mlp.gate", "mlp.gate_proj"),
                     ("mlp.up", "mlp.up_proj"), ("mlp.down", "mlp.down_proj")]:
            names += [(f"{ours}{a}.{p}", f"{hf}{b}.{p}") for p in params]
    return names


def _state_dict_from_hf(cfg: GPTConfig, hf_sd: dict, model_type: str) -> dict:
    sd = {}
    if model_type == "gpt2":
        for ours, hf, transpose in _gpt2_names(cfg):
            sd[ours] = hf_sd[hf].t() if transpose else hf_sd[hf]
    else:
        for ours, hf in _llama_names(cfg):
            sd[ours] = hf_sd[hf]
        for i in range(cfg.n_layer):  # q, k, v projections -> one fused qkv, in that order
            hf = f"model.layers.{i}.self_attn."
            for p in ("weight", "bias") if cfg.bias else ("weight",):
                sd[f"blocks.{i}.attn.qkv.{p}"] = torch.cat([hf_sd[f"{hf}{x}_proj.{p}"] for x in "qkv"])
    sd["lm_head.weight"] = sd["tok_emb.weight"] if cfg.tie_embeddings else hf_sd["lm_head.weight"]
    return sd


def _state_dict_to_hf(cfg: GPTConfig, sd: dict, model_type: str) -> dict:
    hf_sd = {}
    if model_type == "gpt2":
        for ours, hf, transpose in _gpt2_names(cfg):
            hf_sd[hf] = sd[ours].t() if transpose else sd[ours]
    else:
        for ours, hf in _llama_names(cfg):
            hf_sd[hf] = sd[ours]
        sizes = [cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
        for i in range(cfg.n_layer):
            hf = f"model.layers.{i}.self_attn."
            for p in ("weight", "bias") if cfg.bias else ("weight",):
                q, k, v = sd[f"blocks.{i}.attn.qkv.{p}"].split(sizes)
                hf_sd.update({f"{hf}q_proj.{p}": q, f"{hf}k_proj.{p}": k, f"{hf}v_proj.{p}": v})
    hf_sd["lm_head.weight"] = sd["lm_head.weight"]
    return hf_sd


def from_hf(hf_model) -> GPT:
    """A new GPT (eval mode, same dtype and device) with the weights of a GPT2LMHeadModel or
    LlamaForCausalLM. Dropout is set to 0: converted models are for inference and comparison."""
    cfg = config_from_hf(hf_model.config)
    p = next(hf_model.parameters())
    with torch.device(p.device):
        model = GPT(cfg).to(p.dtype)
    sd = _state_dict_from_hf(cfg, hf_model.state_dict(), hf_model.config.model_type)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def to_hf(model: GPT):
    """A transformers model (eval mode, eager attention, same dtype and device) with this
    model's weights: GPT2LMHeadModel for GPT-2 style configs, LlamaForCausalLM for Llama style."""
    import transformers

    cfg = model.config
    hf_config = config_to_hf(cfg)
    cls = transformers.GPT2LMHeadModel if hf_config.model_type == "gpt2" else transformers.LlamaForCausalLM
    p = next(model.parameters())
    hf_model = cls(hf_config).to(device=p.device, dtype=p.dtype)
    hf_sd = _state_dict_to_hf(cfg, model.state_dict(), hf_config.model_type)
    missing, unexpected = hf_model.load_state_dict(hf_sd, strict=False)
    # HF may list buffers (e.g. GPT-2's causal `bias` in old versions) that are not weights
    missing = [k for k in missing if k in dict(hf_model.named_parameters())]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping incomplete: missing {missing}, unexpected {unexpected}")
    return hf_model.eval()
