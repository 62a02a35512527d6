"""An OpenAI-compatible HTTP API over the engine (FastAPI + uvicorn): `/v1/models`,
`/v1/completions`, `/v1/chat/completions` (with server-sent-event streaming), `/metrics`
(Prometheus, vLLM's names) and `/health`. The official `openai` client, given this server's
base URL, works unchanged (tests/camplib/serving/test_server.py uses it).

Reliability, as a client sees it: a bad request is a 4xx in OpenAI's error shape (malformed
JSON, unknown fields, unknown model, a prompt over the context length, max_tokens out of
range); beyond the queue limit it is a 429, not unbounded memory; a client that goes away
mid-request frees its batch slot and KV blocks; on SIGTERM uvicorn stops accepting and the
requests in flight finish before the engine stops.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from camplib.serving.detokenize import Detokenizer
from camplib.serving.engine import Engine
from camplib.serving.loading import ServedModel
from camplib.serving.metrics import CONTENT_TYPE
from camplib.serving.protocol import APIError, ChatRequest, CompletionRequest, error_body
from camplib.serving.runner import DONE, EngineLoop
from camplib.serving.scheduler import QueueFull
from camplib.serving.sequence import SamplingParams

__all__ = ["create_app"]

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 429: "rate_limit_exceeded"}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
    if err.get("type") == "model_attributes_type" and not where:
        return "the request body must be a JSON object (send Content-Type: application/json)", None
    if err.get("type") == "json_invalid":
        return f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}", None
    if err.get("type") == "extra_forbidden":
        return f"unknown or unsupported field {where!r}", where
    if err.get("type") in ("missing",):
        return f"missing required field {where!r}", where
    return f"{where}: {err.get('msg')} (got {err.get('input')!r})" if where else err.get("msg"), where or None


def create_app(served: ServedModel, engine: Engine, burst_s: float = 0.02) -> FastAPI:
    runner = EngineLoop(engine, burst_s=burst_s)
    ctx = served.model.config.max_seq_len
    vocab = served.model.config.vocab_size

    @asynccontextmanager
    async def lifespan(app):
        runner.start()
        yield
        await asyncio.to_thread(runner.stop)   # uvicorn gets here after the open requests finished

    app = FastAPI(title="camplib generation service", lifespan=lifespan)
    app.state.engine, app.state.runner, app.state.served = engine, runner, served

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, param=param), 400)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        return JSONResponse(error_body(str(exc.detail), _TYPES.get(exc.status_code, "server_error")), exc.status_code)

    @app.get("/health")
    async def health():
        return {"status": "ok", **engine.kv_usage()}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.render() if engine.metrics else b"", media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                            "owned_by": "llm-camp", "max_model_len": ctx}]}

    def submit(req, prompt: list[int], max_tokens: int | None):
        if req.model != served.name:
            raise APIError(404, f"The model {req.model!r} does not exist; this server serves {served.name!r}",
                           param="model", code="model_not_found")
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        if any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        if len(prompt) >= ctx:
            raise APIError(400, f"This model's maximum context length is {ctx} tokens, the prompt has "
                                f"{len(prompt)}", param="messages" if isinstance(req, ChatRequest) else "prompt",
                           code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = ctx - len(prompt)
        if not 1 <= max_tokens <= ctx:
            raise APIError(400, f"max_tokens must be between 1 and {ctx}, got {max_tokens}", param="max_tokens")
        if len(prompt) + max_tokens > ctx:
            raise APIError(400, f"This model's maximum context length is {ctx} tokens, you requested "
                                f"{len(prompt) + max_tokens} ({len(prompt)} in the prompt, {max_tokens} for the "
                                f"completion)", param="max_tokens", code="context_length_exceeded")
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature,
                                top_p=req.top_p if req.top_p < 1 else None, seed=req.seed, stop_ids=served.stop_ids)
        try:
            return runner.submit(prompt, params)
        except QueueFull as exc:
            raise APIError(429, f"server busy: {exc}; retry later", "rate_limit_exceeded", code="queue_full")
        except ValueError as exc:
            raise APIError(400, str(exc))

    async def tokens(seq, queue, request: Request):
        """The request's tokens as they come; aborts the sequence if the client goes away."""
        try:
            while True:
                try:
                    tok = await asyncio.wait_for(queue.get(), 0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                if tok is DONE:
                    return
                if tok == -1:
                    raise APIError(500, "the engine failed on this request", "server_error")
                yield tok
        finally:
            if not seq.finished:
                runner.abort(seq)   # client gone, a stop string, or an error: free slot and blocks

    def stops(req) -> list[str]:
        return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])

    async def respond(req, request: Request, prompt: list[int], max_tokens, chat: bool):
        seq, queue = submit(req, prompt, max_tokens)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created, detok = int(time.time()), Detokenizer(served.decode, stops(req))
        obj = "chat.completion" if chat else "text_completion"

        def usage():
            n = len(seq.output)
            return {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}

        def reason():
            return "stop" if detok.stopped else seq.finish_reason

        def choice(text, finish, first=False):
            if chat:
                delta = ({"role": "assistant", "content": text} if first else {"content": text}) if text or first else {}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if not req.stream:
            text = []
            async with aclosing(tokens(seq, queue, request)) as stream:   # closing aborts a stopped sequence
                async for tok in stream:
                    text.append(detok.push(tok))
                    if detok.stopped:
                        break
            text.append(detok.flush())
            out = "".join(text)
            body = {"index": 0, "message": {"role": "assistant", "content": out}, "logprobs": None,
                    "finish_reason": reason()} if chat else choice(out, reason())
            return {"id": rid, "object": obj, "created": created, "model": served.name, "choices": [body],
                    "usage": usage()}

        async def events():
            chunk = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created, "model": served.name}
            if chat:
                yield f"data: {json.dumps({**chunk, 'choices': [choice('', None, first=True)]})}\n\n"
            async with aclosing(tokens(seq, queue, request)) as stream:
                async for tok in stream:
                    delta = detok.push(tok)
                    if delta:
                        yield f"data: {json.dumps({**chunk, 'choices': [choice(delta, None)]})}\n\n"
                    if detok.stopped:
                        break
            yield f"data: {json.dumps({**chunk, 'choices': [choice(detok.flush(), reason())]})}\n\n"
            if req.stream_options and req.stream_options.include_usage:
                yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage()})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        prompt = served.encode(req.prompt) if isinstance(req.prompt, str) else req.prompt
        return await respond(req, request, prompt, req.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        prompt = served.encode(served.chat_prompt([m.model_dump(exclude_none=True) for m in req.messages]))
        return await respond(req, request, prompt, req.max_completion_tokens or req.max_tokens, chat=True)

    return app
