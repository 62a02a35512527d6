"""Hardware-aware kernels (lab a09): attention computed tile by tile so that the (N, N) score
matrix never exists in memory. `flash` is FlashAttention-2 written in plain PyTorch, to read and
to test; its loops are the ones a GPU kernel runs, one tile per thread block."""
