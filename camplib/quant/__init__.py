"""Quantization from scratch (lab a07): one idea per module.

| module       | what                                                                          |
|--------------|-------------------------------------------------------------------------------|
| `formats`    | absmax and zero-point integers per tensor / channel / group; int4 nibble packing |
| `nf4`        | NF4 (QLoRA's 16-value code book) in blocks, with double quantization of absmax |
| `layers`     | weight-only quantized Linear layers (int8, int4, NF4) that dequantize on the fly |
| `llm_int8`   | LLM.int8(): int8 matmul with outlier input features (|x| >= 6) kept in float   |
| `gptq`       | GPTQ: column-by-column quantization with the inverse-Hessian error update; whole models block by block |
| `qat`        | fake quantization with a straight-through gradient; QATLinear                  |
| `qlora`      | LoRA (camplib.lora) on an NF4-quantized frozen base, base bytes measured       |
| `ggml_blocks`| llama.cpp's Q8_0 / Q4_0 / Q4_1 blocks (what a .gguf file holds: camplib.gguf)  |

Conventions shared by all of them: a weight is (out_features, in_features); groups run along
in_features; two 4-bit codes per byte with the *first* code in the high nibble (bitsandbytes'
order, so NF4 here equals `bitsandbytes.functional.quantize_4bit` bit for bit).
"""
from camplib.quant.formats import (dequantize_absmax, dequantize_zero_point, pack_int4, quantize_absmax,
                                   quantize_zero_point, unpack_int4)
from camplib.quant.nf4 import NF4_CODE, NF4Weight, dequantize_nf4, dynamic_map, quantize_nf4
from camplib.quant.layers import QuantLinear, quantize_model

__all__ = ["quantize_absmax", "dequantize_absmax", "quantize_zero_point", "dequantize_zero_point", "pack_int4",
           "unpack_int4", "NF4_CODE", "NF4Weight", "quantize_nf4", "dequantize_nf4", "dynamic_map", "QuantLinear",
           "quantize_model"]
