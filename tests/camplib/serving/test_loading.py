"""What `camp serve` loads besides camplib checkpoints: a transformers folder (--hf) and a .gguf
file (--gguf; --smollm2 is tests/camplib/serving/test_smollm2_served.py): the same weights as
camplib.hf.from_hf, the folder's tokenizer and chat template, and its end-of-turn id as the stop."""
import pytest
import torch

from camplib.gguf import tokenizer_from_gguf
from camplib.hf import from_hf
from camplib.serving.loading import load_gguf, load_hf
from tests.camplib.gguf.tiny_files import random_llama, write_llama_gguf


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    hf = random_llama(tied=False, seed=1)
    write_llama_gguf(folder / "tiny.gguf", hf, quantized=False)
    hf.save_pretrained(folder / "folder")
    tokenizer_from_gguf(folder / "tiny.gguf").save_pretrained(folder / "folder")
    return folder, hf


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_served_model_has_the_weights_tokenizer_and_template(model_files, kind):
    folder, hf = model_files
    served = load_hf(folder / "folder") if kind == "hf" else load_gguf(folder / "tiny.gguf")
    want = from_hf(hf).state_dict()
    for name, got in served.model.state_dict().items():
        assert torch.equal(got, want[name]), f"{kind}: {name} differs"
    assert served.name == ("folder" if kind == "hf" else "tiny")
    text = "the answer is here"
    assert served.decode(served.encode(text)) == text
    assert served.stop_ids == (2,)           # <|im_end|>, the file's eos
    prompt = served.chat_prompt([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n"
