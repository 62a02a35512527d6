"""Pipeline parallelism on gloo ranks: the loss and every gradient equal one process's
(fp64 within 1e-12, fp32 within 1e-6), the activations in flight are the schedule's, bad sizes
fail before any rank starts, and torch.distributed.pipelining computes the same gradients."""
import pytest
import torch
import torch.distributed.pipelining  # noqa: F401  imported once here: the forked ranks inherit it

from camplib.dist import on_ranks
from camplib.losses import cross_entropy
from camplib.model import GPT, GPTConfig
from camplib.parallel.pipeline.stages import PipelineStage, pipeline_step, split_layers
from camplib.parallel.pipeline.run import run_pipeline
from camplib.parallel.pipeline.schedule import build_schedule
from tests.support import assert_close

TOL = {torch.float64: 1e-12, torch.float32: 1e-6}


def make_case(style: str, n_layer: int, dtype=torch.float64, batch: int = 8, seed: int = 0):
    """A small GPT and a batch, with the single-process loss and gradients."""
    torch.manual_seed(seed)
    config = getattr(GPTConfig, f"{style}_style")(n_layer=n_layer, d_model=16, n_head=2, vocab_size=32, max_seq_len=8)
    gpt = GPT(config).to(dtype)
    idx, targets = torch.randint(0, 32, (batch, 8)), torch.randint(0, 32, (batch, 8))
    _, loss = gpt(idx, targets)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in gpt.named_parameters()}
    gpt.zero_grad(set_to_none=True)
    return gpt, idx, targets, loss.detach(), grads


def check_equal_to_one_process(case, p, m, v, schedule):
    gpt, idx, targets, loss, grads = case
    out = run_pipeline(gpt, idx, targets, p, m, v, schedule, timeout=30)
    tol = TOL[gpt.tok_emb.weight.dtype]
    what = f"{schedule} p={p} m={m} v={v}"
    assert_close(f"loss, {what}", out["loss"], loss, atol=tol, rtol=tol)
    assert_close(f"grads, {what}", out["grads"], grads, atol=tol, rtol=tol)
    return out


@pytest.mark.parametrize("style,schedule,m,v", [
    ("gpt2", "gpipe", 4, 1), ("gpt2", "1f1b", 4, 1), ("gpt2", "1f1b", 1, 1), ("gpt2", "interleaved", 4, 2),
    ("llama", "1f1b", 8, 1), ("llama", "interleaved", 2, 2),
])
def test_two_ranks_equal_one_process_fp64(style, schedule, m, v):
    out = check_equal_to_one_process(make_case(style, 4), 2, m, v, schedule)
    expected_peak = [m, m] if schedule == "gpipe" else None
    if schedule == "1f1b":
        expected_peak = [min(2, m), 1]
    if expected_peak:
        assert out["peak_in_flight"] == expected_peak, (schedule, m, out["peak_in_flight"])


def test_two_ranks_equal_one_process_fp32_odd_micro_batches():
    check_equal_to_one_process(make_case("gpt2", 3, torch.float32, batch=6), 2, 3, 1, "1f1b")


@pytest.mark.slow
def test_four_ranks_equal_one_process():
    case = make_case("gpt2", 8)
    out = check_equal_to_one_process(case, 4, 8, 1, "1f1b")
    assert out["peak_in_flight"] == [4, 3, 2, 1]
    out = check_equal_to_one_process(case, 4, 4, 2, "interleaved")
    assert out["peak_in_flight"] == [8, 8, 8, 8]   # m == p: interleaved warms up with every forward


def test_split_layers_is_even_and_consecutive():
    assert split_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert split_layers(4, 4) == [range(i, i + 1) for i in range(4)]


@pytest.mark.parametrize("p,m,v,batch,message", [
    (3, 2, 1, 8, r"cannot split n_layer=2 blocks into 3 pipeline stages"),
    (2, 2, 2, 8, r"cannot split n_layer=2 blocks into 4 pipeline stages"),
    (2, 3, 1, 8, r"batch of 8 sequences cannot be cut into m=3 equal micro-batches: 8 % 3 = 2"),
    (2, 0, 1, 8, r"m \(micro-batches\) must be a positive integer"),
])
def test_bad_sizes_fail_before_any_rank_starts(monkeypatch, p, m, v, batch, message):
    import camplib.parallel.pipeline.run as runner
    monkeypatch.setattr(runner, "on_ranks", lambda *a, **k: pytest.fail("ranks started despite bad sizes"))
    gpt = GPT(GPTConfig(n_layer=2, d_model=16, n_head=2, vocab_size=32, max_seq_len=8))
    idx = torch.zeros(batch, 4, dtype=torch.long)
    schedule = "interleaved" if v > 1 else "1f1b"
    with pytest.raises(ValueError, match=message):
        run_pipeline(gpt, idx, idx, p, m, v, schedule)


def test_a_deadlocking_schedule_fails_before_any_rank_starts(monkeypatch):
    import camplib.parallel.pipeline.run as runner
    monkeypatch.setattr(runner, "on_ranks", lambda *a, **k: pytest.fail("ranks started despite a bad schedule"))
    gpt = GPT(GPTConfig(n_layer=2, d_model=16, n_head=2, vocab_size=32, max_seq_len=8))
    idx = torch.zeros(4, 4, dtype=torch.long)
    bad = build_schedule("1f1b", 2, 2)
    bad[1] = bad[1][1:] + bad[1][:1]  # the last rank runs its first forward last
    with pytest.raises(ValueError, match="deadlocks|before its forward"):
        run_pipeline(gpt, idx, idx, 2, 2, 1, bad)


def _torch_pipelining_rank(rank, p, gpt, idx, targets, m, schedule):
    """torch.distributed.pipelining driving camplib's PipelineStage modules (the last returns logits)."""
    from torch.distributed.pipelining import PipelineStage as TorchStage, Schedule1F1B, ScheduleGPipe
    stage = PipelineStage(gpt, rank, p)
    torch_stage = TorchStage(stage, rank, p, torch.device("cpu"))

    def loss_fn(logits, t):
        return cross_entropy(logits.reshape(-1, logits.size(-1)), t.reshape(-1))

    runner = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule](torch_stage, m, loss_fn=loss_fn)
    if rank == 0:
        runner.step(idx)
    else:
        runner.step(target=targets)
    return {"grads": {n: q.grad for n, q in stage.named_parameters()}}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_torch_pipelining_computes_the_same_gradients(schedule):
    gpt, idx, targets, _, grads = make_case("llama", 4)   # untied head: torch does not sum tied weights
    out = on_ranks(_torch_pipelining_rank, 2, gpt, idx, targets, 4, schedule, timeout=30)
    theirs = {n: g for rank in out["grads"] for n, g in rank.items()}
    assert_close(f"torch.distributed.pipelining {schedule} grads", theirs, grads, atol=1e-12, rtol=1e-12)


def _step_that_never_sends(stages, actions, micro_batches, comm):
    """Rank 0 computes nothing and sends nothing: rank 1 waits for its first activation."""
    if stages[0].is_first:
        return torch.zeros(())
    return pipeline_step(stages, actions, micro_batches, comm)


def test_a_missing_message_times_out_naming_what_was_awaited():
    from camplib.dist import RankError
    gpt, idx, targets, _, _ = make_case("llama", 2)   # untied: rank 0 ends its step at once
    with pytest.raises(RankError, match=r"rank 1: stage 1 waited more than 2 s for micro-batch 0's activation "
                                        r"from stage 0 \(rank 0\)"):
        run_pipeline(gpt, idx, targets, 2, 2, 1, "1f1b", _step_that_never_sends, timeout=2)


def test_recorded_actions_share_one_clock_and_follow_the_schedule():
    gpt, idx, targets, _, _ = make_case("gpt2", 2)
    out = run_pipeline(gpt, idx, targets, 2, 2, 1, "1f1b", timeout=30)
    assert [[a for a, _, _ in ev] for ev in out["events"]] == [[tuple(a) for a in r] for r in build_schedule("1f1b", 2, 2)]
    first = {(a[0], a[1], r): (s, e) for r, ev in enumerate(out["events"]) for a, s, e in ev}
    assert min(s for s, _ in first.values()) == 0.0
    # stage 1 computes micro-batch 0 only after stage 0 started it, stage 0's backward after stage 1's
    # started (not "ended": the end is read after the send is posted, and the receiver may run first)
    assert first[("F", 0, 1)][0] > first[("F", 0, 0)][0]
    assert first[("B", 0, 0)][0] > first[("B", 0, 1)][0]


def test_ranks_inputs_hold_no_seed_to_rebuild_the_other_stages():
    """`pipeline_inputs` (what the grader hands each rank of a04's hidden step): a rank gets its own
    stages' weights and the model's shape, never the spec's seed, so it cannot rebuild another
    stage's weights; the step on those inputs is still the one-process step (fp64, 1e-12). (~3 s)"""
    from camplib.dist.separate import on_separate_ranks
    from camplib.parallel.model_specs import build_model
    from camplib.parallel.pipeline.run import join_pipeline, pipeline_inputs, run_pipeline_spec

    config = {"vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 16, "max_seq_len": 8}
    spec = {"kind": "gpt", "config": config, "dtype": "float64", "seed": 1234}
    g = torch.Generator().manual_seed(5)
    idx, targets = torch.randint(0, 32, (4, 8), generator=g), torch.randint(0, 32, (4, 8), generator=g)
    actions = [[tuple(a) for a in rank] for rank in build_schedule("1f1b", 2, 2, 1)]
    inputs = pipeline_inputs(spec, idx, targets, 2, 2, 1, actions)
    real = build_model(spec).state_dict()
    for rank, mine in enumerate(inputs):
        assert "seed" not in mine["spec"], f"rank {rank}'s spec carries the seed"
        rebuilt = build_model(mine["spec"]).state_dict()
        others = [n for n, t in mine["state"].items() if t.is_floating_point() and t.isnan().all()]
        assert others, f"rank {rank} holds every stage's weights"
        drawn = [n for n in others if real[n].std() > 0]      # not the norms' ones and the biases' zeros
        assert drawn and not any(torch.equal(rebuilt[n], real[n]) for n in drawn), \
            f"rank {rank} rebuilds another stage's weights from its spec"
    out = join_pipeline(on_separate_ranks("camplib.parallel.pipeline.run.pipeline_spec_rank", pipeline_step, inputs),
                        2, 1)
    ref = run_pipeline_spec(spec, idx, targets, 2, 2, 1, "1f1b")
    assert_close("loss on ranks handed pipeline_inputs", out["loss"], ref["loss"], atol=1e-12, rtol=1e-12)
    assert_close("grads on ranks handed pipeline_inputs", out["grads"], ref["grads"], atol=1e-12, rtol=1e-12)
