"""Small Llama-family .gguf files written the way llama.cpp's converter writes them, from a random
transformers LlamaForCausalLM: tensor names, q/k rows permuted into RoPE's interleaved pairing,
a byte-level BPE vocabulary with control tokens and a chat template (used by tests/camplib/gguf
and tests/camplib/serving)."""
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

import gguf

T = gguf.GGMLQuantizationType


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: half-split rows -> interleaved, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_vocab():
    """A byte-level BPE: the 256 byte symbols, a few merges, control tokens at the front."""
    alphabet = list(bytes_to_unicode().values())
    merges = ["Ġ t", "e r", "Ġt h", "i n", "r e", "Ġ a", "Ġth e", "o n", "Ġ Ġ", "ĠĠ ĠĠ", "2 0"]   # "20": digit runs
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + [m.replace(" ", "") for m in merges]
    return tokens, merges


def write_llama_gguf(path, hf: LlamaForCausalLM, quantized: bool, pre: str = "gpt2"):
    c = hf.config
    tokens, merges = tiny_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_eos_token_id(2)
    w.add_bos_token_id(1)
    w.add_pad_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(c.num_hidden_layers):
        for a, b in [("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
                     ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                     ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                     ("mlp.down_proj", "ffn_down")]:
            names[f"model.layers.{i}.{a}.weight"] = f"blk.{i}.{b}.weight"
    for hf_name, name in names.items():
        x = sd[hf_name]
        if name.endswith("attn_q.weight"):
            x = llama_cpp_permute(x, c.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            x = llama_cpp_permute(x, c.num_key_value_heads)
        kind = None
        if quantized and x.ndim == 2:
            kind = T.Q8_0 if name == "token_embd.weight" else T.Q4_1
        if kind is None:
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
        else:
            raw = gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), kind)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_llama(tied: bool, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tiny_vocab()[0]), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=5e4,
                      rms_norm_eps=1e-5, tie_word_embeddings=tied, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():   # norms away from 1, so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model
