"""Graph capture of camplib's GPT: graph breaks listed (and gone with torch's fused loss), an
exported program with a dynamic length equal to eager, saved and run in a fresh process."""
import pytest
import torch

from camplib.compress.static_graph import (
    export_logits,
    graph_breaks,
    loss_without_breaks,
    run_saved_in_fresh_process,
    save_program,
    time_steps,
)
from camplib.model import GPT, GPTConfig
from tests.support import assert_close


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=4, d_model=32, max_seq_len=32)).eval()


def test_graph_breaks_are_listed_and_removed(gpt):
    x = torch.randint(0, 64, (2, 8))
    y = torch.randint(0, 64, (2, 8))
    with_loss = graph_breaks(gpt, x, y)           # camplib.losses checks targets with .item()
    assert with_loss["breaks"] >= 1 and all("item()" in r for r in with_loss["reasons"]), with_loss
    assert_close("loss without graph breaks vs GPT's own", loss_without_breaks(gpt, x, y), gpt(x, y)[1])
    # that loss_without_breaks has none: test_compiled_step_equals_eager compiles it with fullgraph=True


def test_export_with_a_dynamic_length_equals_eager_and_refuses_length_one(gpt, tmp_path):
    program = export_logits(gpt, torch.randint(0, 64, (2, 8)))
    for shape in [(2, 2), (3, 17), (5, 32)]:
        idx = torch.randint(0, 64, shape)
        with torch.no_grad():
            assert_close(f"exported logits, input {shape}", program.module()(idx), gpt(idx)[0], atol=1e-5)
    with pytest.raises(ValueError, match="seq >= 2"):
        export_logits(gpt, torch.randint(0, 64, (2, 1)))
    with pytest.raises(AssertionError, match="Guard failed"):    # lengths 2..max_seq_len only
        program.module()(torch.randint(0, 64, (2, 33)))


@pytest.mark.slow
def test_saved_program_runs_in_a_fresh_process(gpt, tmp_path):
    program = export_logits(gpt, torch.randint(0, 64, (2, 8)), dynamic_batch=False)
    path = save_program(program, tmp_path / "gpt.pt2")
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        assert_close("logits from the program reloaded in a fresh process", run_saved_in_fresh_process(path, idx),
                     gpt(idx)[0], atol=1e-5)


@pytest.mark.slow
def test_compiled_step_equals_eager(gpt):
    """AOTAutograd's captured forward and backward, in one graph (fullgraph=True fails on any graph
    break); inductor's code generation is measured in benchmarks/compress_speed.py (16 s+ on 2
    cores, too slow for the suite)."""
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    torch._dynamo.reset()
    compiled = torch.compile(loss_without_breaks, backend="aot_eager", fullgraph=True)
    loss = compiled(gpt, x, y)
    grads = torch.autograd.grad(loss, list(gpt.parameters()))
    expected = loss_without_breaks(gpt, x, y)
    expected_grads = torch.autograd.grad(expected, list(gpt.parameters()))
    torch._dynamo.reset()
    assert_close("compiled loss", loss, expected)
    assert_close("compiled gradients", list(grads), list(expected_grads))
    times = time_steps(lambda: loss_without_breaks(gpt, x, y), n=2)
    assert sorted(times) == ["first", "median"] and times["median"] > 0
