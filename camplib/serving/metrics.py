"""Prometheus metrics of the service, as vLLM (v1) exposes them: the same names (`vllm:` prefix),
labels (`model_name`, `engine`; `finished_reason` on `vllm:request_success`) and histogram
buckets (vllm/v1/metrics/loggers.py, `PrometheusStatLogger`), so dashboards and alerts written
against vLLM's current names, the course's (course/monitoring/) among them, read this server
unchanged. vLLM's deprecated names (`time_per_output_token_seconds`, now `inter_token_latency_seconds`;
`gpu_cache_usage_perc`, now `kv_cache_usage_perc`) are not exposed.

What each one measures, with the engine's timestamps (`Sequence`):
- arrival: `Engine.add`; scheduled: the first step that admits the request (not a re-admission
  after a preemption); first / last token: when the step that sampled it returns its tokens;
- `time_to_first_token_seconds` = first token - arrival (a generated token, never the empty
  role chunk a chat stream sends first), `inter_token_latency_seconds` = the gap before each
  later token, `request_time_per_output_token_seconds` = decode time / (generated - 1);
- per finished request: e2e = finish - arrival, queue = scheduled - arrival, prefill = first
  token - scheduled, decode = last token - first token, inference = last token - scheduled, and
  its prompt / generated token counts and max_tokens (a request aborted before it ran has only
  e2e, queue and its reason);
- per step: `iteration_tokens_total` = prompt tokens of requests that got their first token +
  tokens generated (vLLM's definition), the running / waiting gauges, KV-cache use (0..1);
- counters: prompt / generation tokens, preemptions, finished requests by reason.

Every series exists from the start, at zero (the reasons stop/length/abort included), as vLLM
does by creating its labelled children up front: a dashboard or an alert on `rate(...)` has
data before the first request. Two gauges that vLLM lacks are under `camplib:`.

Each `ServingMetrics` has its own registry (several engines in one process, e.g. tests, don't
collide); `render()` is the text `/metrics` serves.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServingMetrics", "CONTENT_TYPE", "FINISH_REASONS", "build_1_2_5_buckets", "histogram_quantile",
           "histogram_mean", "read_histograms"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISH_REASONS = ("stop", "length", "abort")
# vLLM's buckets (seconds / tokens)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets for max_model_len)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class ServingMetrics:
    def __init__(self, model_name: str, max_model_len: int, engine: str = "0"):
        self.registry = r = CollectorRegistry()
        self.model_name, self.engine = model_name, engine
        names = ["model_name", "engine"]
        values = (model_name, engine)

        def one(cls, name, doc, **kw):
            return cls(name, doc, names, registry=r, **kw).labels(*values)

        counts = build_1_2_5_buckets(max_model_len)
        self.running = one(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = one(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = one(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = one(Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = one(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = one(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.request_prompt_tokens = one(Histogram, "vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                         buckets=counts)
        self.request_generation_tokens = one(Histogram, "vllm:request_generation_tokens",
                                             "Number of generation tokens processed.", buckets=counts)
        self.iteration_tokens = one(Histogram, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                    buckets=ITERATION_TOKEN_BUCKETS)
        self.max_num_generation_tokens = one(Histogram, "vllm:request_max_num_generation_tokens",
                                             "Histogram of maximum number of requested generation tokens.", buckets=counts)
        self.params_max_tokens = one(Histogram, "vllm:request_params_max_tokens",
                                     "Histogram of the max_tokens request parameter.", buckets=counts)
        self.ttft = one(Histogram, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                        buckets=TTFT_BUCKETS)
        self.itl = one(Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                       buckets=TOKEN_LATENCY_BUCKETS)
        self.tpot = one(Histogram, "vllm:request_time_per_output_token_seconds",
                        "Histogram of time_per_output_token_seconds per request.", buckets=TOKEN_LATENCY_BUCKETS)
        latency = {"e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
                   "queue": ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
                   "inference": ("vllm:request_inference_time_seconds",
                                 "Histogram of time spent in RUNNING phase for request."),
                   "prefill": ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
                   "decode": ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.")}
        self.latency = {key: one(Histogram, name, doc, buckets=REQUEST_LATENCY_BUCKETS)
                        for key, (name, doc) in latency.items()}
        # not vLLM's: the same usage in blocks and bytes (lab p03's block-size explorer talks in both)
        self.kv_blocks = one(Gauge, "camplib:kv_blocks_in_use", "KV cache blocks in use.")
        self.kv_bytes = one(Gauge, "camplib:kv_cache_bytes_in_use", "Bytes of the KV blocks in use.")

    # what the engine reports -------------------------------------------------------------------
    def on_step(self, *, running: int, waiting: int, blocks_in_use: int, num_blocks: int, bytes_per_block: int,
                preempted: int, prompt_tokens: int, generated: int) -> None:
        """After each engine step: the scheduler's state, and this step's preemptions and tokens
        (prompt_tokens: of the requests that got their first token in it)."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(blocks_in_use / num_blocks)
        self.kv_blocks.set(blocks_in_use)
        self.kv_bytes.set(blocks_in_use * bytes_per_block)
        self.preemptions.inc(preempted)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        if prompt_tokens + generated:
            self.iteration_tokens.observe(prompt_tokens + generated)

    def on_token(self, seq, now: float) -> None:
        """A token was generated for `seq` at `now` (before seq's timestamps are updated)."""
        if seq.first_token_time is None:
            self.ttft.observe(now - seq.arrival)
        else:
            self.itl.observe(now - seq.last_token_time)

    def on_finish(self, seq, now: float) -> None:
        """`seq` finished (its finish_reason set) at `now`."""
        self.success[seq.finish_reason].inc()
        self.latency["e2e"].observe(now - seq.arrival)
        scheduled = seq.scheduled_time if seq.scheduled_time is not None else now
        self.latency["queue"].observe(scheduled - seq.arrival)
        if seq.first_token_time is None:
            return
        first, last, n = seq.first_token_time, seq.last_token_time, len(seq.output)
        self.latency["prefill"].observe(first - scheduled)
        self.latency["decode"].observe(last - first)
        self.latency["inference"].observe(last - scheduled)
        if n > 1:
            self.tpot.observe((last - first) / (n - 1))
        self.request_prompt_tokens.observe(len(seq.prompt))
        self.request_generation_tokens.observe(n)
        self.max_num_generation_tokens.observe(n)   # one sample per request (no `n` parameter here)
        self.params_max_tokens.observe(seq.params.max_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def read_histograms(text: str) -> dict[str, list[tuple[float, float]]]:
    """{histogram name: [(upper bound `le`, cumulative count), ...] in bound order} of a /metrics
    text, each summed over its label sets (as `sum by (le)` does)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                counts = out.setdefault(s.name[:-len("_bucket")], {})
                counts[le] = counts.get(le, 0.0) + s.value
    return {name: sorted(counts.items()) for name, counts in out.items()}


def histogram_mean(text: str, name: str) -> float:
    """name_sum / name_count of a histogram in a /metrics text, over its label sets: the exact
    mean of what was observed (NaN before the first observation)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = {"_sum": 0.0, "_count": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name[len(name):] in total and s.name.startswith(name):
                total[s.name[len(name):]] += s.value
    return total["_sum"] / total["_count"] if total["_count"] else float("nan")


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The q-quantile of a cumulative histogram [(le, count), ..., (inf, total)] as Prometheus'
    `histogram_quantile` estimates it: linear inside the bucket holding rank q * total (the
    first bucket from 0), the largest finite bound if the rank falls in +Inf; NaN when empty."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if not buckets or buckets[-1][0] != float("inf") or total == 0:
        return float("nan")
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le if len(buckets) > 1 else float("nan")
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return float("nan")
