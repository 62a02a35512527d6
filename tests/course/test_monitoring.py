"""course/monitoring/ against a live scrape: `camp serve`'s app (the same `build(parse_args(...))`,
served in a thread of this process) and Debian's Prometheus, started with the repository's
prometheus.yml (its target and interval pointed at this server), a few requests, then every
PromQL expression of every panel of the Grafana dashboard (grafana.json) evaluated through
Prometheus' HTTP API: each must return data, and a finite value. camplib's `histogram_quantile`
(the lab's plot) is checked against Prometheus' own on the same counts.

Without a `prometheus` executable the test is skipped loudly (a warning and the skip reason);
under CI=true it fails: `make test` installs Debian's package as root (`make prometheus`).
About 10-20 s (Prometheus' start, six 1-second scrapes).
"""
import json
import math
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from camplib.serving.metrics import histogram_quantile, read_histograms
from tests.support import free_port, not_run
from tests.camplib.serving.conftest import MODEL, RunningServer, served_checkpoint  # noqa: F401  (a fixture)

MONITORING = Path(__file__).resolve().parents[2] / "course" / "monitoring"
pytestmark = pytest.mark.slow


class _Starting(Exception):
    """Prometheus is up but not ready to answer queries yet."""


def _prometheus() -> str:
    path = os.environ.get("CAMP_PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(path, os.X_OK):
        message = "PROMETHEUS TEST NOT RUN: no prometheus executable (apt-get install prometheus, or set CAMP_PROMETHEUS)"
        not_run(message, " (CI must run it: `make test` installs Debian's prometheus as root)")
    return path


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out += [(p["title"], t["expr"]) for t in p.get("targets", []) if t.get("expr")]
    return out


def test_every_dashboard_panel_returns_data_from_a_live_scrape(tmp_path, served_checkpoint):
    prometheus = _prometheus()
    dashboard = json.loads((MONITORING / "grafana.json").read_text())
    queries = panel_queries(dashboard)
    assert len(queries) >= 20 and {"Token throughput", "Time to first token", "Inter-token latency",
                                   "End-to-end request latency", "Queue time", "KV-cache usage"} <= {t for t, _ in queries}
    server = RunningServer(served_checkpoint, "--max-batch", "2", "--block-size", "8")
    prom = None
    try:
        config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        config["scrape_configs"][0]["static_configs"] = [{"targets": [server.base.removeprefix("http://")]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
        api = f"http://127.0.0.1:{port}/api/v1/query"

        def query(expr: str) -> list:
            r = httpx.get(api, params={"query": expr}, timeout=10)
            if r.status_code == 503:   # Prometheus answers 503 until its storage is ready
                raise _Starting(r.text[:300])
            assert r.status_code == 200, f"{expr}: HTTP {r.status_code} {r.text[:300]}"
            return r.json()["data"]["result"]

        def wait_for(expr: str, ok, what: str, timeout: float = 30):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                assert prom.poll() is None, f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-1500:]}"
                try:
                    result = query(expr)
                    if result and ok(float(result[0]["value"][1])):
                        return
                except (httpx.HTTPError, _Starting):
                    pass
                time.sleep(0.3)
            pytest.fail(f"{what} not seen by Prometheus after {timeout} s: {expr}")

        wait_for(f'vllm:num_preemptions_total{{model_name="{MODEL}"}}', lambda v: v == 0,
                 "the server's series at zero before any request")
        with ThreadPoolExecutor(6) as pool:   # 6 clients, 2 batch slots: some wait in the queue
            done = list(pool.map(lambda i: httpx.post(server.base + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": f"request {i}", "max_tokens": 4 + 3 * i}).status_code, range(6)))
        assert done == [200] * 6
        wait_for(f'sum(vllm:request_success_total{{model_name="{MODEL}"}})', lambda v: v == 6, "the 6 finished requests")
        time.sleep(1.5)   # one more scrape: rate() needs two samples after the increase
        for title, expr in queries:
            promql = expr.replace("$model_name", MODEL).replace("$__rate_interval", "1m")
            result = query(promql)
            assert result, f"panel {title!r}: {promql} returned no data"
            values = [float(r["value"][1]) for r in result]
            assert all(math.isfinite(v) for v in values), f"panel {title!r}: {promql} returned {values}"
        # the lab's quantiles (camplib.serving.metrics.histogram_quantile) = Prometheus' own
        text = httpx.get(server.base + "/metrics", timeout=5).text
        hists = read_histograms(text)
        for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:request_generation_tokens"):
            for q in (0.5, 0.9, 0.99):
                theirs = float(query(f'histogram_quantile({q}, sum by(le) ({name}_bucket{{model_name="{MODEL}"}}))')[0]["value"][1])
                ours = histogram_quantile(q, hists[name])
                assert ours == pytest.approx(theirs, rel=1e-9), f"{name} q={q}: camplib {ours} != Prometheus {theirs}"
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(10)
        server.close()
