"""The OpenAI API's request bodies (the subset served) and its error shape.

Models forbid unknown fields: a misspelled or unsupported parameter (`logit_bias`, `best_of`,
`n=2`...) is a 400 naming it, never silently ignored. Every error the server returns is
`{"error": {"message", "type", "param", "code"}}`, which the `openai` client turns into its
typed exceptions (BadRequestError, NotFoundError, RateLimitError...).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CompletionRequest", "ChatRequest", "ChatMessage", "StreamOptions", "APIError", "error_body"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    max_tokens: int | None = 16    # the completions API's default


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: str
    name: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


class APIError(Exception):
    """Raised by a handler; becomes an OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
