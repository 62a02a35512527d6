"""camplib: the small, readable library the LLM Camp labs build piece by piece.

Each module is what a finished lab leaves behind, so later labs can import it instead of
re-deriving it: `device` (where to run, seeding), `attention` (softmax, scaled dot-product and
multi-head attention, KV cache), `attention_backend` (which attention kernel is faster here:
measured per device, dtype and size, cached, overridable), `rope` (rotary position embeddings),
`activations` (SiLU written out, and SwiGLU's gate on torch's kernel), `model` (a GPT-2 / Llama
style decoder), `hf` (weights exchanged with Hugging Face `transformers`), `gguf` (llama.cpp's
model files read from scratch: SmolLM2-135M-Instruct as a camplib GPT), `tokenizer`
(byte-level BPE), `data` (the standard-library corpus, de-duplication, packing, sharded loading),
`optim`, `schedule`, `train_state` and `trainer` (the training loop), `generate` (sampling),
`amp` (loss scaling, fp32 master weights, fp16/bf16 ranges), `memory` (bytes of parameters,
gradients, optimizer state and activations), `activation_checkpoint` (activation checkpointing),
`fused` (LayerNorm+GELU through torch.compile), `dist` (running N ranks, and `on_ranks`, the one
way to run a function on them and collect plain data; ring collectives from send/recv, bytes
measured), `parallel` (training on many ranks: data parallelism with bucketed all-reduce launched
from autograd hooks, ZeRO stages 1-3, compressed all-reduce, tensor / sequence / pipeline /
context parallelism, the 4D mesh, distributed checkpoints), `losses` (cross-entropy),
`monitoring` (TensorBoard and Prometheus metrics), `profiling` (where a step's time goes, MFU),
`lora`, `prompt_tuning` and `intents` (fine-tuning, a06), `quant` (a07), `compress` (pruning,
distillation, graph capture: a08), `kernels` (FlashAttention, Triton, fused operators: a09), and
what the projects leave behind: `codegen` (p01), `dialogue` (p02), `serving` (p03).

Importing `camplib` imports nothing heavy: submodules are loaded when first used, so
`import camplib` stays cheap and never pulls in `transformers`.
"""
import importlib

__all__ = ["device", "attention", "attention_backend", "rope", "activations", "model", "hf", "gguf", "tokenizer", "data", "optim", "schedule",
           "train_state", "trainer", "generate", "dist", "amp", "memory", "activation_checkpoint", "fused", "parallel",
           "losses", "monitoring", "profiling", "lora", "prompt_tuning", "intents", "quant", "compress",
           "kernels", "codegen", "dialogue", "serving"]


def __getattr__(name):
    # Lazy submodules (PEP 562): `camplib.model` works without an explicit import.
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
