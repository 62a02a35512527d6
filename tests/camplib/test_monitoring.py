"""camplib.monitoring through camplib.trainer.Trainer: the TensorBoard event files read back with
tensorboard's own reader, and the Prometheus registry scraped (in process and over HTTP on
127.0.0.1 only). Event files store fp32, so logged values are compared with rtol 1e-6; the
Prometheus text format keeps Python floats, compared exactly."""
import math
import urllib.request

import pytest
import torch

from camplib.monitoring import TAGS, PrometheusExporter, TensorBoardLogger, read_scalars
from camplib.trainer import _global_grad_norm
from tests.camplib.test_trainer import ROWS_PER_BATCH, SEQ, make_trainer

STEPS, GRAD_ACCUM = 6, 2
TOKENS_PER_STEP = GRAD_ACCUM * ROWS_PER_BATCH * SEQ


@pytest.fixture
def monitored(tmp_path):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry=registry)
    trainer = make_trainer(monitors=[TensorBoardLogger(tmp_path / "tb"), exporter], grad_accum=GRAD_ACCUM)
    trainer.fit(STEPS)
    trainer.close()
    return trainer, tmp_path / "tb", exporter


def test_tensorboard_event_files_hold_every_step(monitored):
    trainer, log_dir, _ = monitored
    scalars = read_scalars(log_dir)
    assert sorted(scalars) == sorted(TAGS.values())
    for tag, series in scalars.items():
        assert [s for s, _ in series] == list(range(1, STEPS + 1)), f"{tag}: steps {[s for s, _ in series]}"
    for field, expected in [("loss", trainer.losses), ("lr", trainer.lrs), ("grad_norm", trainer.grad_norms)]:
        got = [v for _, v in scalars[TAGS[field]]]
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-12), f"{field}: logged {got}, trainer {expected}"
    assert scalars["train/lr"][0][1] == 0.0 and scalars["train/lr"][2][1] > 0  # the warm-up is visible
    assert all(v > 0 and math.isfinite(v) for _, v in scalars["train/tokens_per_s"])
    assert all(v > 1e6 for _, v in scalars["train/memory_bytes"])  # a Python process holds > 1 MB


def test_prometheus_registry_holds_the_last_step_and_totals(monitored):
    trainer, _, exporter = monitored
    values, last = exporter.values(), trainer.last_metrics
    assert last.step == STEPS and last.tokens == TOKENS_PER_STEP
    expected = {"camplib_train_loss": trainer.losses[-1], "camplib_train_learning_rate": trainer.lrs[-1],
                "camplib_train_grad_norm": trainer.grad_norms[-1], "camplib_train_step": STEPS,
                "camplib_train_steps_total": STEPS, "camplib_train_tokens_total": STEPS * TOKENS_PER_STEP,
                "camplib_train_tokens_per_second": last.tokens_per_s, "camplib_train_memory_bytes": last.memory_bytes}
    for name, value in expected.items():
        assert values[name] == value, f"{name}: registry {values.get(name)}, expected {value}"


def test_prometheus_http_endpoint_on_loopback():
    from prometheus_client.parser import text_string_to_metric_families

    exporter = PrometheusExporter(port=0)  # a free port on 127.0.0.1
    try:
        trainer = make_trainer(monitors=[exporter])
        trainer.fit(2)
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as response:
            text = response.read().decode()
        scraped = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
        assert scraped["camplib_train_steps_total"] == 2
        assert scraped["camplib_train_loss"] == trainer.losses[-1]
        assert exporter.server.server_address[0] == "127.0.0.1"
    finally:
        exporter.close()
    assert exporter.server is None


def test_monitoring_changes_nothing_in_the_run(tmp_path):
    plain = make_trainer().fit(STEPS)
    watched = make_trainer(monitors=[TensorBoardLogger(tmp_path / "tb"), PrometheusExporter()])
    assert watched.fit(STEPS) == plain  # bit for bit: no random draws, no tensor touched
    watched.close()


def test_grad_norm_without_clipping_equals_torch():
    model = torch.nn.Linear(5, 3)
    model(torch.randn(4, 5)).pow(2).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    assert _global_grad_norm(model.parameters()) == pytest.approx(float(expected), rel=1e-6)
    trainer = make_trainer(clip=None, monitors=[PrometheusExporter()])
    trainer.fit(1)
    assert trainer.grad_norms == [] and trainer.last_metrics.grad_norm > 0
