"""Prometheus metrics of the service, named as vLLM names them (`vllm:num_requests_running`,
`vllm:time_to_first_token_seconds`, ...) with its `model_name` label, so dashboards written
for vLLM (its Grafana example) read this server unchanged.

Each `ServingMetrics` has its own registry (several engines in one process, e.g. tests, don't
collide); `render()` is the text `/metrics` serves.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServingMetrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets for these histograms (seconds)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class ServingMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        labels = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be admitted", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Sequences preempted for lack of KV blocks",
                                   labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens", labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Arrival to first token", labels,
                              buckets=_TTFT, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Inter-token latency", labels,
                              buckets=_TPOT, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token", labels,
                             buckets=_E2E, registry=r)
        self.finished = Counter("vllm:request_success", "Finished requests by reason",
                                labels + ["finished_reason"], registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1)", labels, registry=r)
        self.kv_blocks = Gauge("vllm:kv_blocks_in_use", "KV cache blocks in use", labels, registry=r)
        self.kv_bytes = Gauge("vllm:kv_cache_bytes_in_use", "Bytes of the KV blocks in use", labels, registry=r)
        self.model_name = model_name

    def _(self, metric):
        return metric.labels(model_name=self.model_name)

    def on_step(self, running: int, waiting: int, blocks_in_use: int, num_blocks: int, bytes_per_block: int):
        self._(self.running).set(running)
        self._(self.waiting).set(waiting)
        self._(self.kv_blocks).set(blocks_in_use)
        self._(self.kv_usage).set(blocks_in_use / num_blocks)
        self._(self.kv_bytes).set(blocks_in_use * bytes_per_block)

    def on_token(self, now: float, arrival: float, previous: float | None):
        self._(self.generation_tokens).inc()
        if previous is None:
            self._(self.ttft).observe(now - arrival)
        else:
            self._(self.tpot).observe(now - previous)

    def on_finish(self, now: float, arrival: float, reason: str):
        self._(self.e2e).observe(now - arrival)
        self.finished.labels(model_name=self.model_name, finished_reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
