"""The HTTP API's request bodies (pydantic) and OpenAI-shaped errors.

Fields follow OpenAI's chat and completions APIs; a few extras say how to decode (`method`,
`top_k`, `tree_size`). Unknown fields are ignored, as OpenAI-compatible servers do, except those
whose meaning we cannot honour (`n` > 1, `logprobs`, `echo`, `best_of` > 1, tools, a
`response_format` other than {"type": "text"}): those are a 400. Integers are strict (a string
"4" is a 400, as OpenAI answers). Every number is bounded here by the type it takes on the device
(top_k and token counts int32, the seed 63 bits, a finite temperature of at most 10): a value
beyond is a 400 that names the limit, never an overflow inside the scheduler.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dart_jax.api import methods as decoding_methods
from dart_jax.api.options import INT32_MAX
from dart_jax.errors import check_text

from .scheduler import MAX_TEMPERATURE

SEED_RANGE = (0, 2**63 - 1)


def _valid_text(value, what: str):
    """Strings (also inside lists and content parts) that are valid Unicode: JSON lets a body carry a
    lone surrogate ("\\ud800"), which no tokenizer takes."""
    if isinstance(value, str):
        check_text(value, what)
    elif isinstance(value, list):
        for item in value:
            _valid_text(item.get("text") if isinstance(item, dict) else item, what)
    return value


class APIError(Exception):
    """An error to send as OpenAI's {"error": {...}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _unicode(cls, content):
        return _valid_text(content, "the message content")

    def text(self) -> str:
        """The message's text; content parts must all be text."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"only text content parts are supported, got a part of type {part.get('type')!r}.",
                               param="messages")
            parts.append(part["text"])
        return "".join(parts)


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, strict=True)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0, le=INT32_MAX, strict=True)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1], strict=True)
    stop: str | list[str] | None = Field(None, validate_default=True)
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: Any = None
    # dart_jax extras
    # one of dart_jax.api.methods' names (the schema lists them; the server answers for those it has loaded)
    method: str = Field("dart", json_schema_extra=lambda schema: schema.update(enum=list(decoding_methods.names())))
    tree_size: int | None = Field(None, ge=decoding_methods.TREE_SIZE_RANGE[0], le=decoding_methods.TREE_SIZE_RANGE[1])

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        if method not in decoding_methods.names():
            raise ValueError(f"method must be one of {', '.join(decoding_methods.names())}, got {method!r}")
        return method

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported (one choice per request); send separate requests instead")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("stop takes up to 16 non-empty strings")
        return _valid_text(stops, "a stop string")

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, response_format):
        # JSON mode and JSON schemas would need constrained decoding: ignoring them would answer free
        # text to a client that parses JSON
        if response_format is not None and response_format != {"type": "text"}:
            kind = response_format.get("type") if isinstance(response_format, dict) else response_format
            raise ValueError(f"response_format {str(kind)[:40]!r} is not supported by this server: only "
                             '{"type": "text"}; drop response_format and ask for the format in the prompt')
        return response_format

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, strict=True)
    logprobs: bool | None = None
    tools: list[Any] | None = None

    @field_validator("logprobs", "tools")
    @classmethod
    def _not_supported(cls, value, info):
        if value:
            what = {"logprobs": "logprobs", "tools": "tools (function calling)"}[info.field_name]
            raise ValueError(f"{what} are not supported by this server")
        return value


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] = Field(...)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            _valid_text(prompt, "the prompt")
        elif isinstance(prompt, str):
            _valid_text(prompt, "the prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ValueError("one prompt per request (a list of several strings is a batch: send them separately)")
            return prompt[0]
        if isinstance(prompt, list) and not prompt:
            raise ValueError("the prompt is empty")
        return prompt

    @field_validator("echo", "suffix", "logprobs", "best_of")
    @classmethod
    def _unsupported(cls, value, info):
        allowed = {"echo": (False,), "suffix": (None, ""), "logprobs": (None,), "best_of": (None, 1)}[info.field_name]
        if value is not None and not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise ValueError(f"{info.field_name} is not supported by this server")
        return value
