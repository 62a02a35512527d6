"""A GPT-2 / Llama style decoder-only transformer in one readable file (after nanoGPT).

One `GPTConfig` covers both families; the switches are the norm (LayerNorm / RMSNorm), the MLP
(GELU / SwiGLU), positions (learned table / RoPE), biases and weight tying.

The model knows nothing of its neighbours: `camplib.hf.from_hf` / `to_hf` map GPT2LMHeadModel
and LlamaForCausalLM weights onto it and back (how the course proves it right: same weights in,
same logits out), and `camplib.generate.generate` decodes from it (greedy, sampling, KV cache,
left padding). They depend on the model, never the other way round.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from camplib.activations import gelu, swiglu
from camplib.attention import BACKENDS, KVCache, MultiHeadAttention
from camplib.kernels.fused_norm import rms_norm
from camplib.losses import cross_entropy
from camplib.rope import RotaryEmbedding, permute_qk_rows

__all__ = ["GPTConfig", "RMSNorm", "MLP", "SwiGLU", "Block", "GPT", "count_parameters",
           "convert_rope_pairing"]


@dataclass
class GPTConfig:
    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int | None = None     # None: n_head (plain multi-head attention)
    d_model: int = 64
    d_ff: int | None = None          # None: 4 * d_model
    max_seq_len: int = 128
    norm: str = "layernorm"          # "layernorm" | "rmsnorm"
    mlp: str = "gelu"                # "gelu" | "swiglu"
    gelu_approximate: str = "tanh"   # "tanh" = GPT-2's gelu_new, "none" = exact erf GELU
    pos: str = "learned"             # "learned" | "rope"
    rope_theta: float = 10000.0
    rope_pairing: str = "half"       # "half" (HF Llama) | "interleaved" (RoFormer, Meta): camplib.rope
    tie_embeddings: bool = True      # lm_head shares the token embedding matrix
    bias: bool = True                # biases in every Linear and LayerNorm
    norm_eps: float = 1e-5
    dropout: float = 0.0
    attention: str = "auto"          # "auto" (the faster of sdpa/matmul here: camplib.attention_backend) | "sdpa" (torch's fused kernel) | "matmul" (explicit matmuls, torch's softmax) | "math" (b01's, from scratch) | "flash" (a09)

    def __post_init__(self):
        for field, allowed in [("norm", ("layernorm", "rmsnorm")), ("mlp", ("gelu", "swiglu")),
                               ("gelu_approximate", ("tanh", "none")), ("pos", ("learned", "rope")),
                               ("rope_pairing", ("half", "interleaved")), ("attention", BACKENDS)]:
            if getattr(self, field) not in allowed:
                raise ValueError(f"GPTConfig.{field}={getattr(self, field)!r}, expected one of {allowed}")
        if self.d_model % self.n_head or self.n_head % self.kv_heads:
            raise ValueError(f"need d_model % n_head == 0 and n_head % n_kv_head == 0, got "
                             f"d_model={self.d_model}, n_head={self.n_head}, n_kv_head={self.n_kv_head}")

    # None-valued fields stay None (so dataclasses.replace(d_model=...) keeps d_ff = 4*d_model);
    # these properties give the values actually used.
    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def gpt2_style(cls, **overrides) -> "GPTConfig":
        """LayerNorm, tanh-GELU MLP, learned positions, biases, tied embeddings: like GPT-2."""
        base = cls(norm="layernorm", mlp="gelu", gelu_approximate="tanh", pos="learned",
                   tie_embeddings=True, bias=True, norm_eps=1e-5)
        return replace(base, **overrides)

    @classmethod
    def llama_style(cls, **overrides) -> "GPTConfig":
        """RMSNorm, SwiGLU, RoPE, no biases, untied head, grouped-query attention: like Llama."""
        base = cls(n_kv_head=2, norm="rmsnorm", mlp="swiglu", pos="rope", tie_embeddings=False,
                   bias=False, norm_eps=1e-6)
        return replace(base, **overrides)


class RMSNorm(nn.Module):
    """x / rms(x) * weight: LayerNorm without centring or bias (cheaper, works as well).

    Computed in (at least) fp32 and cast back before the weight, as HF Llama does, so bf16/fp16
    models match it and the mean of squares cannot overflow in fp16. Unlike HF, fp64 inputs
    stay fp64, so fp64 reference checks keep their precision.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x_hat = x * rsqrt(mean(x^2) + eps), then weight * x_hat.to(x.dtype): the formula, as one
        # autograd Function with its backward written out (camplib.kernels.fused_norm: fewer
        # passes and less saved; tested equal to torch's F.rms_norm and HF Llama's norm)
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """GPT-2's feed-forward: Linear up to d_ff, GELU, Linear back down (camplib.activations.gelu:
    the tanh form as x * sigmoid(2 z), its derivative written out, ~5x faster than F.gelu's on
    an AVX2 CPU)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ff_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ff_dim, cfg.d_model, bias=cfg.bias)
        self.approximate = cfg.gelu_approximate
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.proj(gelu(self.fc(x), self.approximate)))


class SwiGLU(nn.Module):
    """Llama's feed-forward: down(silu(gate(x)) * up(x)); the gate lets the MLP switch features
    on and off per token (Shazeer 2020). On torch's SiLU kernel (camplib.activations.swiglu)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ff_dim, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.ff_dim, bias=cfg.bias)
        self.down = nn.Linear(cfg.ff_dim, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.down(swiglu(self.gate(x), self.up(x))))


def make_norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)). Normalising the branch
    inputs (not the residual stream) keeps deep stacks trainable without warm-up tricks."""

    def __init__(self, cfg: GPTConfig, rope: RotaryEmbedding | None = None):
        super().__init__()
        self.config = cfg          # what a copy of the block needs (TensorParallelBlock.from_dense)
        self.ln1 = make_norm(cfg)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_head, cfg.kv_heads, bias=cfg.bias,
                                       rope=rope, dropout=cfg.dropout, backend=cfg.attention)
        self.ln2 = make_norm(cfg)
        self.mlp = SwiGLU(cfg) if cfg.mlp == "swiglu" else MLP(cfg)

    def forward(self, x, cache: KVCache | None = None, attn_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None):
        x = x + self.attn(self.ln1(x), attn_mask=attn_mask, cache=cache, positions=positions)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token (+ learned position) embeddings, n_layer Blocks, a final norm and the LM head.
    Weights start as in GPT-2: N(0, 0.02), zero biases, unit norms."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.pos == "learned" else None
        # one RoPE table shared by every layer (a non-persistent buffer, not a parameter)
        rope = (RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_pairing)
                if cfg.pos == "rope" else None)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, rope) for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2*n_layer),
        # so the stream's variance does not grow with depth
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                caches: list[KVCache] | None = None, *, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: (B, T) token ids -> (logits (B, T, vocab), loss or None).

        `targets` are already shifted: targets[:, t] is the token that follows idx[:, t]
        (for a sequence s, call model(s[:, :-1], s[:, 1:])). Positions with -100 are ignored.
        With `caches` (one KVCache per layer, see new_caches) idx holds only the new tokens,
        which continue the cached ones.

        Batches of prompts padded on the left (camplib.generate) pass `attention_mask` (B, S),
        1/True for real tokens and 0 for pads over all S = cached + new keys, so no query reads a
        pad, and `positions` (B, T), each token's position counted without the pads (learned
        table and RoPE alike). Without them, token t sits at position offset + t.
        """
        B, T = idx.shape
        offset = caches[0].length if caches is not None else 0
        if offset + T > self.config.max_seq_len:
            raise ValueError(f"sequence of {offset + T} tokens exceeds max_seq_len={self.config.max_seq_len}")
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, offset + T):
                raise ValueError(f"attention_mask must be (batch, cached + new) = {(B, offset + T)}, "
                                 f"got {tuple(attention_mask.shape)}")
            key_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S): broadcast over heads, queries
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            pos = torch.arange(offset, offset + T, device=idx.device) if positions is None else positions
            x = x + self.pos_emb(pos)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=caches[i] if caches is not None else None, attn_mask=key_mask,
                      positions=positions)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:  # at least fp32 (log-softmax over a big vocab in bf16 loses too much)
            loss_dtype = torch.promote_types(logits.dtype, torch.float32)
            loss = cross_entropy(logits.to(loss_dtype), targets, ignore_index=-100)  # camplib.losses
        return logits, loss

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters, each shared (tied) tensor counted once. exclude_embeddings
        leaves out the token and position embedding tables (when tied, that is also lm_head)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            n -= self.pos_emb.weight.numel() if self.pos_emb is not None else 0
        return n

    def new_caches(self, batch: int, max_len: int | None = None) -> list[KVCache]:
        """One empty KVCache per layer, in the model's dtype and device."""
        cfg, p = self.config, self.tok_emb.weight
        return [KVCache(batch, cfg.kv_heads, max_len or cfg.max_seq_len, cfg.head_dim,
                        dtype=p.dtype, device=p.device) for _ in range(cfg.n_layer)]


def count_parameters(cfg: GPTConfig, exclude_embeddings: bool = False) -> int:
    """The exact parameter count of GPT(cfg), from the config alone (no model built)."""
    d, f, b = cfg.d_model, cfg.ff_dim, int(cfg.bias)
    qkv_out = (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim
    attn = d * qkv_out + b * qkv_out + d * d + b * d
    if cfg.mlp == "swiglu":
        mlp = 3 * d * f + b * (2 * f + d)
    else:
        mlp = 2 * d * f + b * (f + d)
    norm = d + b * d if cfg.norm == "layernorm" else d
    embeddings = cfg.vocab_size * d + (cfg.max_seq_len * d if cfg.pos == "learned" else 0)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    total = cfg.n_layer * (attn + mlp + 2 * norm) + norm + head
    return total if exclude_embeddings else total + embeddings


def convert_rope_pairing(model, pairing: str):
    """A copy of a camplib GPT with RoPE `pairing` that computes the same function: the q and k
    rows of every layer's fused qkv projection (weight and bias) permuted per head, everything
    else copied. (Scores q.k are sums over features, so reordering q and k alike changes
    nothing; RoPE then rotates the same pairs by the same angles.)"""
    cfg = model.config
    if cfg.pos != "rope":
        raise ValueError(f"the model has pos={cfg.pos!r}: no RoPE to convert")
    new = GPT(replace(cfg, rope_pairing=pairing)).to(next(model.parameters()))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if pairing != cfg.rope_pairing:
        q_rows, k_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        for name in [n for n in state if n.endswith(("attn.qkv.weight", "attn.qkv.bias"))]:
            w = state[name]
            q, k, v = w[:q_rows], w[q_rows:q_rows + k_rows], w[q_rows + k_rows:]
            state[name] = torch.cat([permute_qk_rows(q, cfg.n_head, pairing),
                                     permute_qk_rows(k, cfg.kv_heads, pairing), v])
    new.load_state_dict(state)
    return new
