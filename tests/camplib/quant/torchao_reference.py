"""Computes torchao 0.18's int8 and QAT results for tests/camplib/quant/test_torchao_side_by_side.py.

Run as a script, never imported by the course: `python torchao_reference.py OUT.pt` with the
reference-only folder (where `make setup` installs torchao) on PYTHONPATH. It rebuilds the test's
inputs from the same seeds (INPUTS, shared with the test) and saves every result with torch.save,
so torchao itself never enters a course process (transformers and peft import torchao whenever it
can be imported, and torchao prints to stderr as it loads).
"""
import sys

import torch

SHAPES = {"small": (64, 256), "large": (128, 512)}   # (out_features, in_features)
TOKENS = 16
GROUP_SIZE = 32


def inputs(name: str) -> dict:
    """The weight, bias, activations and upstream gradient for one shape, from fixed seeds."""
    out_f, in_f = SHAPES[name]
    g = torch.Generator().manual_seed(1234 + out_f)
    return {"weight": torch.randn(out_f, in_f, generator=g) / in_f ** 0.5,
            "bias": torch.randn(out_f, generator=g) * 0.1,
            "x": torch.randn(TOKENS, in_f, generator=g),
            "grad": torch.randn(out_f, in_f, generator=g)}


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    import torchao
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.qat import IntxFakeQuantizeConfig, IntxFakeQuantizer

    results = {"version": torchao.__version__}
    for name in SHAPES:
        t = inputs(name)
        r = results[name] = {}
        for key, config in (("weight_only", Int8WeightOnlyConfig()),
                            ("dynamic", Int8DynamicActivationInt8WeightConfig())):
            linear = torch.nn.Linear(*reversed(SHAPES[name]))
            with torch.no_grad():
                linear.weight.copy_(t["weight"])
                linear.bias.copy_(t["bias"])
            quantize_(linear, config)
            w = linear.weight
            with torch.no_grad():
                r[key] = {"type": type(w).__name__, "qdata": w.qdata.clone(), "scale": w.scale.clone(),
                          "zero_point": None if w.zero_point is None else w.zero_point.clone(),
                          "dequantized": w.dequantize(), "out": linear(t["x"])}
        for key, config in (("qat_int8_channel", IntxFakeQuantizeConfig(torch.int8, PerAxis(0))),
                            ("qat_int4_group", IntxFakeQuantizeConfig(torch.int4, PerGroup(GROUP_SIZE)))):
            quantizer = IntxFakeQuantizer(config)
            w = t["weight"].clone().requires_grad_(True)
            fq = quantizer(w)
            fq.backward(t["grad"])
            r[key] = {"forward": fq.detach(), "grad": w.grad.clone(),
                      "scale": quantizer.scale.detach().clone(), "zero_point": quantizer.zero_point.detach().clone()}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
