"""The OpenAI request bodies the server accepts, as pydantic models, and the OpenAI error shape.

What: `ChatRequest` (/v1/chat/completions) and `CompletionRequest` (/v1/completions) with OpenAI's field names and
ranges, plus the extensions vLLM/SGLang clients send (research/serving-protocol.md §1.1, §5): `top_k`,
`chat_template_kwargs` (`enable_thinking`, `clear_thinking`), `return_token_ids`, `stop_token_ids`,
`ignore_eos`, `include_reasoning`, `return_routed_experts`. Unknown fields are errors (a misspelt `max_token` would otherwise be silently
ignored); accepted-but-unsupported OpenAI fields are errors only when set to something other than their default.

`ApiError(status, message, param)` carries one error to the handler, which answers
`{"error": {"message", "type", "param", "code"}}` — the body the `openai` SDK reads `message` from.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 415: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
               503: "server_error"}  # fmt: skip
MAX_TOP_LOGPROBS = 20
MAX_N = 16
MAX_STOP_CHARS = 256  # per stop string: each is searched for at every generated token


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool = False
    continuous_usage_stats: bool = False


class Sampling(_Strict):
    """Fields both endpoints share."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM: -1 or 0 = off
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    # SGLang's name: each choice gets `routed_experts`, the experts every MoE layer routed each token to (vLLM's int16
    # [seq_len - 1, MoE layers, top_k], base64: docs/serve.md) — routing replay for an RL trainer
    return_routed_experts: bool = False
    user: str | None = None
    # accepted for compatibility; only their defaults are supported (checked in unsupported())
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ApiError(400, f"stop: at most 4 sequences, got {len(stops)}", "stop")
        if any(s == "" for s in stops):
            raise ApiError(400, "stop: sequences must not be empty", "stop")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ApiError(400, f"stop: sequences may have at most {MAX_STOP_CHARS} characters", "stop")
        return stops

    def unsupported(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported by this server (leave it 0)", name)
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported by this server", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")


class ChatTemplateKwargs(_Strict):
    enable_thinking: bool = True
    clear_thinking: bool = True


class ChatRequest(Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: ChatTemplateKwargs | None = None
    include_reasoning: bool = True
    response_format: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ApiError(400, "response_format: only {'type': 'text'} is supported", "response_format")
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.suffix:
            raise ApiError(400, "suffix is not supported by this server", "suffix")
        if self.best_of not in (None, 1, self.n):
            raise ApiError(400, "best_of is not supported by this server (leave it unset)", "best_of")
        if self.echo and self.stream:
            raise ApiError(400, "echo with stream=true is not supported", "echo")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line naming the first offending field, from pydantic's error list."""
    err = errors[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    # unions report each branch; keep the path up to the first branch name (e.g. "str", "list[int]")
    field = ".".join(p for p in loc if not p.startswith(("str", "list[", "dict[", "int", "function-")))
    if err.get("type") == "extra_forbidden":
        return f"unknown field {field!r}", field
    return f"{field or 'body'}: {err.get('msg', 'invalid value')}", field or None


class WeightsRequest(_Strict):
    """POST /update_weights_from_disk (SGLang's route and field names): an RL trainer's weight push."""

    model_path: str  # an HF folder (`glmstack` checkpoints' export) or a .safetensors file of the model's state dict
    weight_version: str | int | None = None  # reported by GET /get_weight_version; None: the previous one + 1


class LoadLoraRequest(_Strict):
    """POST /v1/load_lora_adapter (vLLM's route and field names): serve a PEFT adapter folder under `lora_name`."""

    lora_name: str = Field(min_length=1, max_length=256)  # what requests then send as their `model`
    lora_path: str  # a PEFT adapter folder inside the server's --weight-root
    load_inplace: bool = False  # replace an adapter of the same name (an RL trainer's adapter push)
    weight_version: str | int | None = None  # as /update_weights_from_disk's; None: the previous one + 1


class UnloadLoraRequest(_Strict):
    """POST /v1/unload_lora_adapter (vLLM's): stop serving the adapter `lora_name`."""

    lora_name: str
