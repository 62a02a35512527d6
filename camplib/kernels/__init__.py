"""Hardware-aware kernels (lab a09): attention computed tile by tile so that the (N, N) score
matrix never exists in memory. `flash` is FlashAttention-2 written in plain PyTorch, to read and
to test; its loops are the ones a GPU kernel runs, one tile per thread block; `triton_flash` is
its forward as one Triton kernel (interpreted on a CPU). `fused_norm`, `fused_swiglu` and
`chunked_ce` are operators with hand-written backwards that recompute instead of saving
(RMSNorm, SwiGLU's gate, the LM head's cross-entropy without the full logits)."""
