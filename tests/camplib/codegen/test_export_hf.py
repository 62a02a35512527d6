"""The saved folder loads in transformers' LlamaForCausalLM with the camplib model's logits."""
import pytest
import torch

from camplib.codegen.export_hf import TOKENIZER_FILE, load_hf_llama, save_hf
from camplib.codegen.corpus import train_tokenizer
from camplib.model import GPT, GPTConfig
from camplib.tokenizer import ByteBPE
from tests.support import assert_close


@pytest.mark.parity
@pytest.mark.slow   # importing transformers' Llama: 3-17 s on 2 busy cores
def test_llama_folder_gives_the_same_logits(tmp_path, capfd):
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama_style(vocab_size=300, d_model=32, n_layer=2, n_head=4, n_kv_head=2,
                                      max_seq_len=64)).eval()
    bpe = train_tokenizer(["def f(x):\n    return x\n" * 5, "import os\n"], 280)
    folder = save_hf(model, tmp_path / "hf", bpe)
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    hf = load_hf_llama(folder)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert capfd.readouterr().err == "", "saving and loading must keep stderr clean (graded cells)"
    idx = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close("LlamaForCausalLM logits vs camplib GPT", hf(idx).logits, model(idx)[0], atol=1e-5, rtol=1e-5)
    again = ByteBPE.load(folder / TOKENIZER_FILE)
    assert again.merges == bpe.merges and again.special_tokens == bpe.special_tokens


def test_gpt2_style_models_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Llama style"):
        save_hf(GPT(GPTConfig.gpt2_style()), tmp_path / "x")
