"""camplib.gguf.reader against the `gguf` package's GGUFReader (llama.cpp's own Python reader) on
files written by its GGUFWriter: every metadata value type, arrays of numbers and of strings,
float and block-quantized tensors of 1-3 dimensions, the default and a custom alignment. Then
malformed files: each is a ValueError that says what is wrong, never another exception or a hang."""
import numpy as np
import pytest
import torch

from camplib.gguf.reader import read_gguf

gguf = pytest.importorskip("gguf")
from gguf.quants import quantize  # noqa: E402

pytestmark = pytest.mark.parity
T = gguf.GGMLQuantizationType


def write_sample(path, seed: int = 0, alignment: int | None = None):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for add, key, value in [("add_uint8", "t.u8", 200), ("add_int8", "t.i8", -7), ("add_uint16", "t.u16", 60000),
                            ("add_int16", "t.i16", -300), ("add_uint32", "t.u32", 4_000_000_000),
                            ("add_int32", "t.i32", -5), ("add_float32", "t.f32", 0.25), ("add_uint64", "t.u64", 2**40),
                            ("add_int64", "t.i64", -(2**40)), ("add_float64", "t.f64", 1e-300),
                            ("add_bool", "t.bool", True), ("add_string", "t.str", "héllo <|im_end|>")]:
        getattr(w, add)(key, value)
    w.add_array("t.ints", [3, 1, 4, 1, 5])
    w.add_array("t.strs", ["Ġa", "", "b c", "日本"])
    w.add_array("t.floats", [0.5, -1.5])
    tensors = {"f32.vec": rng.standard_normal(7).astype(np.float32),
               "f16.mat": rng.standard_normal((3, 5)).astype(np.float16),
               "f32.cube": rng.standard_normal((2, 3, 4)).astype(np.float32)}
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    quantized = {}
    for kind in ("Q8_0", "Q4_0", "Q4_1"):
        x = rng.standard_normal((6, 64)).astype(np.float32)
        raw = quantize(x, T[kind])
        w.add_tensor(f"{kind}.w", raw, raw_shape=raw.shape, raw_dtype=T[kind])
        quantized[f"{kind}.w"] = x.shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors, quantized


@pytest.mark.parametrize("alignment", [None, 64])
def test_metadata_and_tensors_equal_gguf_readers(tmp_path, alignment):
    path = tmp_path / "sample.gguf"
    tensors, quantized = write_sample(path, alignment=alignment)
    ours, ref = read_gguf(path), gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.metadata[key] == field.contents(), key
    assert set(ours.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        got = ours.tensor(t.name)
        assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want.astype(np.float32)), t.name
        assert np.array_equal(ours.raw(t.name).numpy(), np.asarray(t.data).reshape(-1).view(np.uint8)), t.name
    for name, arr in tensors.items():
        assert ours.tensors[name].shape == arr.shape and torch.equal(ours.tensor(name), torch.from_numpy(arr).float())
    for name, shape in quantized.items():
        assert ours.tensors[name].shape == shape and ours.tensors[name].kind == name.split(".")[0]


def test_truncated_files_are_value_errors_at_every_length(tmp_path):
    """Cut the file at many lengths (header, metadata, tensor infos, data): each read either
    fails with a ValueError naming the file or, cut only in the final padding, still reads."""
    path = tmp_path / "sample.gguf"
    write_sample(path)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in sorted({0, 3, 4, 8, 23, 24, *range(25, len(data), 37)}):
        cut.write_bytes(data[:n])
        try:
            f = read_gguf(cut)
        except ValueError as exc:
            assert "cut.gguf" in str(exc), (n, exc)
        else:
            assert all(t.offset + t.nbytes <= n for t in f.tensors.values()), n


def test_wrong_magic_version_and_absurd_counts_are_refused(tmp_path):
    path = tmp_path / "sample.gguf"
    write_sample(path)
    data = bytearray(path.read_bytes())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(bad)
    bad.write_bytes(data[:4] + (9).to_bytes(4, "little") + data[8:])
    with pytest.raises(ValueError, match="version 9"):
        read_gguf(bad)
    # the first key's length claims 2**62 bytes
    bad.write_bytes(data[:24] + (2**62).to_bytes(8, "little") + data[32:])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_gguf(bad)


def test_an_unsupported_tensor_type_is_listed_and_named_when_read(tmp_path):
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("q6k", np.zeros((2, 210), dtype=np.uint8), raw_shape=(2, 210), raw_dtype=T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = read_gguf(path)
    assert f.tensors["q6k"].shape == (2, 256)
    with pytest.raises(NotImplementedError, match="q6k"):
        f.tensor("q6k")
