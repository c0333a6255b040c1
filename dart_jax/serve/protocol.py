"""The HTTP API's request bodies (pydantic) and OpenAI-shaped errors.

Fields follow OpenAI's chat and completions APIs; a few extras say how to decode (`method`,
`top_k`, `tree_size`) and four of vLLM's are honoured (`stop_token_ids`, `ignore_eos`,
`max_completion_tokens` on both endpoints, `chat_template_kwargs` of `enable_thinking` alone).
Unknown fields are ignored, as OpenAI-compatible servers do, except those that would change the
answer and that we cannot honour (`UNHONOURED`: OpenAI's and vLLM's penalties, logit_bias, tools,
logprobs, guided decoding, beam search, prompt and template options, ...; an assistant turn's
`tool_calls` / `function_call`; and `n` > 1, a `response_format` other than text): any value but
the field's default is a 400 naming it. Types are strict (a string "4", or `true` for a number, is
a 400, as OpenAI answers). Every number is bounded here by the type it takes on the device (top_k and token
counts int32, the seed 63 bits, a finite temperature of at most 10): a value beyond is a 400 that
names the limit, never an overflow inside the scheduler.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

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


def _is_default(value, defaults: tuple) -> bool:
    """Whether `value` (parsed JSON) is one of `defaults`: 0 and 0.0 alike, `false` never a number."""
    numbers = (int, float)  # exact types: bool is not one of them
    return any(value is d or ((type(value) is type(d) or (type(value) in numbers and type(d) in numbers))
                              and value == d) for d in defaults)


# Fields that change the answer and that this server cannot honour: field → (the values that ask
# for nothing, what the field asks for). Any other value is a 400 naming the field: ignoring it
# would answer something else than what the client asked for.
UNHONOURED = {
    "logit_bias": ((None, {}), "token biases"),
    "presence_penalty": ((None, 0), "a presence penalty"),
    "frequency_penalty": ((None, 0), "a frequency penalty"),
    "repetition_penalty": ((None, 1), "a repetition penalty"),
    "length_penalty": ((None, 1), "a length penalty (beam search)"),
    "use_beam_search": ((None, False), "beam search"),
    "min_p": ((None, 0), "min-p sampling"),
    "min_tokens": ((None, 0), "a minimum answer length (EOS held back)"),
    "allowed_token_ids": ((None,), "sampling among some token ids only"),
    "bad_words": ((None, []), "words never to generate"),
    "logits_processors": ((None, []), "logits processors"),
    "guided_json": ((None,), "guided decoding"),
    "guided_regex": ((None,), "guided decoding"),
    "guided_choice": ((None,), "guided decoding"),
    "guided_grammar": ((None,), "guided decoding"),
    "structured_outputs": ((None,), "guided decoding"),
    "include_stop_str_in_output": ((None, False), "the stop string kept at the answer's end"),
    "skip_special_tokens": ((None, True), "special tokens in the answer's text"),
    "add_special_tokens": ((None, False), "special tokens (such as BOS) added to the prompt"),
    "truncate_prompt_tokens": ((None,), "the prompt cut to its last tokens"),
    "prompt_logprobs": ((None,), "log probabilities"),
    "echo": ((None, False), "the prompt (or the last message) repeated before the answer"),
    # the chat endpoint's
    "logprobs": ((None, False), "log probabilities"),
    "top_logprobs": ((None, 0), "log probabilities"),
    "tools": ((None, []), "function calling"),
    "tool_choice": ((None, "none"), "function calling"),
    "parallel_tool_calls": ((None, True), "function calling"),
    "functions": ((None, []), "function calling"),
    "function_call": ((None, "none"), "function calling"),
    "modalities": ((None, ["text"]), "an answer other than text"),
    "audio": ((None,), "an answer other than text"),
    "prediction": ((None,), "predicted outputs"),
    "reasoning_effort": ((None,), "a reasoning effort"),
    "verbosity": ((None, "medium"), "an answer's verbosity"),
    "web_search_options": ((None,), "a web search"),
    "add_generation_prompt": ((None, True), "a prompt without the assistant turn's opening"),
    "continue_final_message": ((None, False), "the last message continued"),
    "chat_template": ((None,), "another chat template"),
    "documents": ((None, []), "documents for the chat template"),
    # the completions endpoint's
    "best_of": ((None, 1), "several answers to choose from"),
    "suffix": ((None, ""), "text after the answer (insertion)"),
    "prompt_embeds": ((None,), "a prompt given as embeddings"),
}
COMMON_UNHONOURED = ("logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty",
                     "use_beam_search", "min_p", "min_tokens", "allowed_token_ids", "bad_words", "logits_processors",
                     "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
                     "include_stop_str_in_output", "skip_special_tokens", "add_special_tokens",
                     "truncate_prompt_tokens", "prompt_logprobs", "echo")
CHAT_UNHONOURED = ("logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "functions",
                   "function_call", "modalities", "audio", "prediction", "reasoning_effort", "verbosity",
                   "web_search_options", "add_generation_prompt", "continue_final_message", "chat_template",
                   "documents")
COMPLETION_UNHONOURED = ("best_of", "suffix", "prompt_embeds")
# chat_template_kwargs: the keys the server honours (each a boolean)
TEMPLATE_SWITCHES = ("enable_thinking",)


def _unhonoured(value, info):
    """The validator of every UNHONOURED field: its default passes, anything else is refused."""
    defaults, what = UNHONOURED[info.field_name]
    if not _is_default(value, defaults):
        shown = " or ".join("null" if d is None else json.dumps(d) for d in defaults)
        raise ValueError(f"{info.field_name} asks for {what}, which this server does not support; drop the field "
                         f"(or send {shown})")
    return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: Any = None  # an assistant turn's function calls: the chat template would drop them
    function_call: Any = None  # the same, in OpenAI's older form

    @field_validator("content")
    @classmethod
    def _unicode(cls, content):
        return _valid_text(content, "the message content")

    @field_validator("tool_calls", "function_call")
    @classmethod
    def _no_tool_calls(cls, calls, info):
        if not _is_default(calls, (None, [])):
            raise ValueError(f"an assistant turn's {info.field_name} (function calling) is not supported by this "
                             "server; send the turn's text as its content")
        return calls

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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = Field(False, strict=True)


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, strict=True)  # before max_tokens
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False, strict=True)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, strict=True)
    top_k: int = Field(0, ge=0, le=INT32_MAX, strict=True)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1], strict=True)
    stop: str | list[str] | None = Field(None, validate_default=True)
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)]] | None = Field(None, max_length=64)
    ignore_eos: bool = Field(False, strict=True)
    n: int = Field(1, strict=True)
    stream: bool = Field(False, strict=True)
    stream_options: StreamOptions | None = None
    response_format: Any = None
    # dart_jax extras
    # one of dart_jax.api.methods' names (the schema lists them; the server answers for those it has loaded)
    method: str = Field("dart", json_schema_extra=lambda schema: schema.update(enum=list(decoding_methods.names())))
    tree_size: int | None = Field(None, ge=decoding_methods.TREE_SIZE_RANGE[0], le=decoding_methods.TREE_SIZE_RANGE[1],
                                  strict=True)
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    length_penalty: Any = None
    use_beam_search: Any = None
    min_p: Any = None
    min_tokens: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    logits_processors: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    add_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    echo: Any = None

    _common_unhonoured = field_validator(*COMMON_UNHONOURED)(_unhonoured)

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
        return self.stream_options is not None and self.stream_options.include_usage

    def answer_tokens(self) -> int | None:
        """The answer's token limit the request asks for (None: up to the context)."""
        return self.max_completion_tokens or self.max_tokens


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: Any = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    documents: Any = None
    # vLLM's options of the chat template: enable_thinking (Qwen3's switch) is honoured
    chat_template_kwargs: dict[str, Any] | None = None

    _unhonoured = field_validator(*CHAT_UNHONOURED)(_unhonoured)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_switches(cls, kwargs):
        for key, value in (kwargs or {}).items():
            if key not in TEMPLATE_SWITCHES:
                raise ValueError(f"chat_template_kwargs takes only {', '.join(TEMPLATE_SWITCHES)}, got {key!r:.40}: "
                                 "this server does not pass other options to the chat template; drop the key")
            if not isinstance(value, bool):
                raise ValueError(f"chat_template_kwargs.{key} must be true or false, got {value!r:.40}")
        return kwargs

    def enable_thinking(self) -> bool | None:
        """Qwen3's thinking switch as the request sets it (None: the server's setting)."""
        return (self.chat_template_kwargs or {}).get("enable_thinking")


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] = Field(...)
    logprobs: int | None = Field(None, strict=True)
    best_of: Any = None
    suffix: Any = None
    prompt_embeds: Any = None

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

    _unhonoured = field_validator(*COMPLETION_UNHONOURED)(_unhonoured)

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs):
        if logprobs is not None:
            raise ValueError("logprobs asks for log probabilities, which this server does not support; drop the field")
        return logprobs
