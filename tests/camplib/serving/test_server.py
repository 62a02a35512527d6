"""The HTTP service through the official `openai` client: answers equal greedy decoding alone,
streaming, concurrent requests, OpenAI-shaped 4xx errors, 429 beyond the queue, disconnects
freeing blocks, metrics with vLLM's names, graceful SIGTERM."""
from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from camplib.generate import generate
from camplib.serving.loading import load_camplib

from .conftest import MODEL, RunningServer

@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def local(served_checkpoint):
    return load_camplib(served_checkpoint)


def _alone(local, prompt_ids, n):
    ids = generate(local.model, torch.tensor([prompt_ids]), n, eos_id=local.stop_ids[0])[0, len(prompt_ids):].tolist()
    return local.decode(ids[:-1] if ids[-1] in local.stop_ids else ids)


def test_models_and_a_completion_equal_greedy_generate(client, local):
    assert [m.id for m in client.models.list().data] == [MODEL]
    prompt = "The quick brown fox"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert out.choices[0].text == _alone(local, local.encode(prompt), 12)
    assert out.usage.prompt_tokens == len(local.encode(prompt)) and out.choices[0].finish_reason in ("length", "stop")


def test_concurrent_requests_each_equal_greedy_alone(client, local):
    prompts = [[int(t) for t in torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (3, 11, 7, 20, 5, 14)]
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda p: client.completions.create(model=MODEL, prompt=p, max_tokens=16,
                                                                 temperature=0).choices[0].text, prompts))
    for i, (p, text) in enumerate(zip(prompts, outs)):
        assert text == _alone(local, p, 16), f"request {i} ({len(p)} prompt tokens) differs from greedy alone"


def test_chat_streaming_equals_the_whole_answer(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and whole.choices[0].message.role == "assistant"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


@pytest.mark.parametrize("case, kwargs, error, needle", [
    ("unknown model", {"model": "gpt-9"}, openai.NotFoundError, "does not exist"),
    ("unknown field", {"extra_body": {"frobnicate": 1}}, openai.BadRequestError, "frobnicate"),
    ("prompt over the context", {"prompt": "x" * 300}, openai.BadRequestError, "maximum context length is 256"),
    ("max_tokens 0", {"max_tokens": 0}, openai.BadRequestError, "max_tokens must be between 1 and 256"),
    ("max_tokens huge", {"max_tokens": 10**6}, openai.BadRequestError, "max_tokens must be between 1 and 256"),
    ("prompt + max_tokens over", {"prompt": "x" * 200, "max_tokens": 100}, openai.BadRequestError, "requested 300"),
    ("temperature out of range", {"temperature": 5}, openai.BadRequestError, "temperature"),
])
def test_bad_requests_get_a_clear_4xx_in_openai_shape(client, case, kwargs, error, needle):
    args = {"model": MODEL, "prompt": "hi", "max_tokens": 4, **kwargs}
    with pytest.raises(error) as info:
        client.completions.create(**args)
    body = info.value.body
    assert needle in body["message"], f"{case}: message {body['message']!r} lacks {needle!r}"
    assert set(body) == {"message", "type", "param", "code"}, f"{case}: not the OpenAI error shape: {body}"


def test_malformed_json_is_400(server):
    r = httpx.post(server.base + "/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                   headers={"content-type": "application/json"}, timeout=5)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"], r.text


def test_disconnect_mid_stream_frees_slot_and_blocks(server, client):
    aborted = server.metric('vllm:request_success_total{engine="0",finished_reason="abort"')
    with httpx.stream("POST", server.base + "/v1/completions", timeout=10,
                      json={"model": MODEL, "prompt": "go", "max_tokens": 250, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(l for l in lines if l.startswith("data:"))   # generation has started
    deadline = time.monotonic() + 10
    while server.metric('vllm:request_success_total{engine="0",finished_reason="abort"') == aborted:
        assert time.monotonic() < deadline, "the server never aborted the stream whose client left"
        time.sleep(0.05)
    health = server.health()
    assert health["blocks_in_use"] == 0, f"{health['blocks_in_use']} KV blocks still held after the client left"
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=3).usage.completion_tokens == 3


def test_request_storm_gets_429_and_the_server_keeps_serving(server, client):
    def one(_):
        try:
            client.completions.create(model=MODEL, prompt="storm", max_tokens=100, temperature=0)
            return 200
        except openai.RateLimitError as exc:
            assert "retry later" in exc.body["message"]
            return 429
    with ThreadPoolExecutor(24) as pool:
        codes = list(pool.map(one, range(24)))
    assert sorted(set(codes)) <= [200, 429] and codes.count(429) >= 8, f"24 requests at once with 4 slots + 4 queued: {codes.count(429)} got 429"
    assert codes.count(200) >= 4, f"only {codes.count(200)} succeeded"
    assert client.completions.create(model=MODEL, prompt="after", max_tokens=3).usage.completion_tokens == 3
    assert server.health()["blocks_in_use"] == 0


def test_metrics_use_vllm_names(server, client):
    client.completions.create(model=MODEL, prompt="count me", max_tokens=5)
    text = httpx.get(server.base + "/metrics", timeout=5).text
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "camplib:kv_blocks_in_use", "vllm:kv_cache_usage_perc"]:
        assert f'{name}{{' in text, f"/metrics lacks {name}"
    assert server.metric("vllm:generation_tokens_total") >= 5 and server.metric("vllm:num_requests_running") == 0


def test_sigterm_finishes_the_requests_in_flight(served_checkpoint):
    """uvicorn's own SIGTERM handler (handle_exit) on a second server: the stream in flight
    completes, new connections are refused, then the app's shutdown drains the engine."""
    running = RunningServer(served_checkpoint, "--max-batch", "2")
    try:
        events, first = [], threading.Event()

        def stream():
            with httpx.stream("POST", running.base + "/v1/completions", timeout=30,
                              json={"model": MODEL, "prompt": "long", "max_tokens": 80, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        events.append(line[5:].strip())
                        first.set()
        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(20), "the stream never started"
        running.uvicorn.handle_exit(signal.SIGTERM, None)
        reader.join(30)
        assert events[-1] == "[DONE]", f"the in-flight stream was cut after {len(events)} events"
        final = json.loads(events[-2])["choices"][0]
        assert final["finish_reason"] in ("length", "stop")
        running.thread.join(20)
        assert not running.thread.is_alive(), "the server did not shut down after SIGTERM"
        assert not running.engine.has_work() and running.engine.blocks.blocks_in_use == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(running.base + "/health", timeout=2)
    finally:
        running.close()


def test_stop_strings_end_the_text_and_the_sequence(server, client):
    full = client.completions.create(model=MODEL, prompt=[65, 66, 67], max_tokens=24, temperature=0).choices[0].text
    visible = full.replace("\ufffd", "")
    stop = visible[len(visible) // 2]
    expected = full[:full.index(stop)]
    out = client.completions.create(model=MODEL, prompt=[65, 66, 67], max_tokens=24, temperature=0, stop=[stop])
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop", (full, stop)
    streamed = client.completions.create(model=MODEL, prompt=[65, 66, 67], max_tokens=24, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected
    deadline = time.monotonic() + 5
    while server.health()["blocks_in_use"]:
        assert time.monotonic() < deadline, "a sequence ended by a stop string kept its KV blocks"
        time.sleep(0.05)
