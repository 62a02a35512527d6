"""The service's /metrics against vLLM's: every request and engine metric of vLLM v1 that applies
to this engine, with vLLM's name, type, labels and buckets, present at zero before the first
request; and the values: counts equal to what the engine did, timings that add up
(inference = prefill + decode, e2e >= queue + inference) and TTFT taken at the first generated
token (a request that waits before the engine steps has at least that wait as TTFT and queue time).

The reference is vLLM's own list, transcribed from vllm/v1/metrics/loggers.py
(`PrometheusStatLogger.__init__`, vLLM 0.10/0.11; `inter_token_latency_seconds` and
`request_time_per_output_token_seconds` replaced the deprecated `time_per_output_token_seconds`).
Left out, as not applying here: prefix-cache, speculative-decoding and LoRA metrics (no such
features), `request_params_n` (no `n` parameter), the deprecated `gpu_cache_usage_perc`."""
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from camplib.serving import Engine, SamplingParams
from camplib.serving.loading import demo_model
from camplib.serving.metrics import ServingMetrics


def _vllm_1_2_5(max_value):   # vLLM's build_1_2_5_buckets, as its docstring shows: 100 -> 1, 2, 5, 10, 20, 50, 100
    out = [m * 10 ** e for e in range(12) for m in (1, 2, 5)]
    return [b for b in out if b <= max_value]


MAX_LEN = 256
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0]
TOKEN_LAT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQ_LAT = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0]
ITER = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
VLLM = {  # name (without the _total / _bucket suffixes): (type, buckets or None)
    "vllm:num_requests_running": ("gauge", None), "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:num_preemptions": ("counter", None), "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None), "vllm:request_success": ("counter", None),
    "vllm:request_prompt_tokens": ("histogram", _vllm_1_2_5(MAX_LEN)),
    "vllm:request_generation_tokens": ("histogram", _vllm_1_2_5(MAX_LEN)),
    "vllm:iteration_tokens_total": ("histogram", ITER),
    "vllm:request_max_num_generation_tokens": ("histogram", _vllm_1_2_5(MAX_LEN)),
    "vllm:request_params_max_tokens": ("histogram", _vllm_1_2_5(MAX_LEN)),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", TOKEN_LAT),
    "vllm:request_time_per_output_token_seconds": ("histogram", TOKEN_LAT),
    "vllm:e2e_request_latency_seconds": ("histogram", REQ_LAT),
    "vllm:request_queue_time_seconds": ("histogram", REQ_LAT),
    "vllm:request_inference_time_seconds": ("histogram", REQ_LAT),
    "vllm:request_prefill_time_seconds": ("histogram", REQ_LAT),
    "vllm:request_decode_time_seconds": ("histogram", REQ_LAT),
}


def families(metrics: ServingMetrics) -> dict:
    """{family name: family} of a scrape (the `_created` timestamps prometheus_client adds aside)."""
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode()) if not f.name.endswith("_created")}


def value(fams, name, suffix="", **labels):
    """The sum of a family's samples named name+suffix whose labels include `labels`."""
    fam = fams[name]
    return sum(s.value for s in fam.samples if s.name == name + suffix and labels.items() <= s.labels.items())


def test_names_types_labels_and_buckets_are_vllms_and_all_start_at_zero():
    fams = families(ServingMetrics("tiny", MAX_LEN))
    vllm_names = {n for n in fams if n.startswith("vllm:")}
    assert vllm_names == set(VLLM), f"missing {sorted(set(VLLM) - vllm_names)}, not vLLM's {sorted(vllm_names - set(VLLM))}"
    for name, (kind, buckets) in VLLM.items():
        fam = fams[name]
        assert fam.type == kind, f"{name}: {fam.type}, vLLM's is a {kind}"
        assert fam.samples, f"{name} has no sample before the first request (vLLM exposes it at zero)"
        for s in fam.samples:
            expected = {"model_name", "engine"} | ({"finished_reason"} if name == "vllm:request_success" else set())
            if s.name.endswith("_bucket"):
                expected.add("le")
            assert set(s.labels) == expected, f"{s.name} labels {sorted(s.labels)}, vLLM's {sorted(expected)}"
            assert s.labels["model_name"] == "tiny" and s.labels["engine"] == "0"
            if not s.name.endswith(("_created", "_bucket")) or s.labels.get("le") == "+Inf":
                assert s.value == 0, f"{s.name} {s.labels} starts at {s.value}, not 0"
        if buckets is not None:
            got = [float(s.labels["le"]) for s in fam.samples if s.name == name + "_bucket"]
            assert got == [float(b) for b in buckets] + [float("inf")], f"{name} buckets {got} != vLLM's {buckets}"
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort"}, f"request_success reasons at start: {reasons}"
    text = ServingMetrics("tiny", MAX_LEN).render().decode()
    assert 'vllm:num_preemptions_total{engine="0",model_name="tiny"} 0.0' in text, "preemptions not printed at 0"


def test_values_count_what_the_engine_did_and_the_times_add_up():
    served = demo_model(seed=0, max_seq_len=MAX_LEN)
    metrics = ServingMetrics("tiny", MAX_LEN)
    engine = Engine(served.model, block_size=4, num_blocks=8, max_batch=4, metrics=metrics)
    prompts = [list(range(1, 1 + n)) for n in (3, 9, 14, 5, 7)]
    wait = 0.15
    seqs = [engine.add(p, SamplingParams(max_tokens=m)) for p, m in zip(prompts, (6, 3, 8, 1, 5))]
    time.sleep(wait)                       # the requests wait before the engine's first step
    while engine.has_work():
        engine.step()
    fams = families(metrics)
    outs = [len(s.output) for s in seqs]
    assert value(fams, "vllm:generation_tokens", "_total") == sum(outs) == value(fams, "vllm:request_generation_tokens", "_sum")
    assert value(fams, "vllm:prompt_tokens", "_total") == sum(map(len, prompts)) == value(fams, "vllm:request_prompt_tokens", "_sum")
    assert value(fams, "vllm:iteration_tokens_total", "_sum") == sum(outs) + sum(map(len, prompts))
    assert value(fams, "vllm:iteration_tokens_total", "_count") == engine.steps
    assert value(fams, "vllm:request_params_max_tokens", "_sum") == 6 + 3 + 8 + 1 + 5
    preempted = sum(s.preemptions for s in seqs)
    assert preempted > 0, "the 8-block pool was meant to force a preemption"
    assert value(fams, "vllm:num_preemptions", "_total") == preempted
    assert value(fams, "vllm:request_success", "_total", finished_reason="length") == 5
    assert value(fams, "vllm:time_to_first_token_seconds", "_count") == 5
    assert value(fams, "vllm:inter_token_latency_seconds", "_count") == sum(outs) - 5
    assert value(fams, "vllm:request_time_per_output_token_seconds", "_count") == sum(n > 1 for n in outs)
    # TTFT at the first generated token: every request waited `wait` before any step ran
    ttft_le = {float(s.labels["le"]): s.value for s in fams["vllm:time_to_first_token_seconds"].samples
               if s.name.endswith("_bucket")}
    assert ttft_le[0.1] == 0 and ttft_le[float("inf")] == 5, f"TTFT buckets {ttft_le}: all should be > {wait} s"
    assert value(fams, "vllm:request_queue_time_seconds", "_sum") >= 5 * wait
    for s in seqs:   # per request, the phases the histograms sum
        assert s.scheduled_time - s.arrival >= wait and s.first_token_time >= s.scheduled_time
    inference = value(fams, "vllm:request_inference_time_seconds", "_sum")
    parts = value(fams, "vllm:request_prefill_time_seconds", "_sum") + value(fams, "vllm:request_decode_time_seconds", "_sum")
    assert inference == pytest.approx(parts, abs=1e-9), "inference time != prefill + decode"
    e2e, queue = value(fams, "vllm:e2e_request_latency_seconds", "_sum"), value(fams, "vllm:request_queue_time_seconds", "_sum")
    assert queue + inference <= e2e + 1e-9, f"queue {queue} + inference {inference} > e2e {e2e}"
    assert value(fams, "vllm:num_requests_running") == 0 and value(fams, "vllm:kv_cache_usage_perc") == 0


def test_an_aborted_waiting_request_counts_as_abort_with_queue_time_only():
    served = demo_model(seed=0, max_seq_len=MAX_LEN)
    metrics = ServingMetrics("tiny", MAX_LEN)
    engine = Engine(served.model, block_size=4, max_batch=1, metrics=metrics)
    first, second = engine.add([1, 2, 3], SamplingParams(max_tokens=4)), engine.add([4, 5], SamplingParams(max_tokens=4))
    engine.step()
    engine.abort(second)
    while engine.has_work():
        engine.step()
    fams = families(metrics)
    assert value(fams, "vllm:request_success", "_total", finished_reason="abort") == 1
    assert value(fams, "vllm:request_queue_time_seconds", "_count") == 2
    assert value(fams, "vllm:request_prefill_time_seconds", "_count") == 1, "a request that never ran has no prefill time"
    assert first.output and not second.output
