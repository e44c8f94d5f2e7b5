"""The request bodies of /v1/completions (`CompletionRequest`) and /v1/chat/completions (`ChatRequest`), as pydantic
models (types, unknown fields and the values this engine cannot honour, as vLLM's protocol models check them),
read into the `Completion` the engine takes by `parse`. A chat's messages become one prompt through CHAT_TEMPLATE,
the plain template of a model that has none (as llama-server falls back to one)."""
import secrets
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from suts.engine.sampling import SamplingParams

GREEDY_BELOW = 1e-5  # a temperature this small is greedy (as vLLM takes it): dividing by it would overflow
NEUTRAL = {"n": 1, "best_of": 1, "stop": None, "suffix": None, "presence_penalty": 0,  # fields other clients send
           "frequency_penalty": 0, "logit_bias": None, "cache_prompt": False}
MAX_LOGPROBS = 20  # the most alternatives a token's top_logprobs lists (OpenAI's and vLLM's default limit)
PROMPT = "prompt must be a non-empty string or list of token ids (one prompt per request)"
CHAT_TEMPLATE = "{role}: {content}\n"  # each message in turn, then "assistant: " for the reply to follow


class BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)  # other options (vLLM's continuous_usage_stats) are ignored
    include_usage: bool = False  # a last chunk with the token counts


class Request(BaseModel):
    """The fields both endpoints take: those the engine honours, then those clients send that it takes at their
    neutral value only (NEUTRAL). Strict: "4" is no integer, 1.0 no boolean; floats finite; anything else is an
    unknown field."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    model: str | None = None
    max_tokens: int = 16
    min_tokens: Annotated[int, Field(ge=0)] = 0  # an EOS before this many tokens does not end the completion
    ignore_eos: bool = False  # only max_tokens ends it: the fixed output lengths benchmark clients ask for
    temperature: float = 1.0  # its range, top_p's and top_k's: SamplingParams' rules
    top_p: float = 1.0
    top_k: int = 0  # -1: none, as vLLM says it
    seed: Annotated[int, Field(ge=0, lt=2 ** 63)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # the generated ids beside the text (vLLM's name; `return_tokens` too)
    return_tokens: bool = False
    return_tokens_as_token_ids: bool = False  # logprobs name each token "token_id:N" (vLLM's), not by its text
    user: str | None = None
    n: Any = None
    best_of: Any = None
    stop: Any = None
    suffix: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    cache_prompt: Any = None

    @field_validator("max_tokens", "min_tokens", "ignore_eos", "temperature", "top_p", "top_k", "stream",
                     "return_token_ids", "return_tokens", "return_tokens_as_token_ids", mode="before")
    @classmethod
    def null_is_default(cls, value, info: ValidationInfo):
        """null, as clients send for "unset", is the field's default."""
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator(*NEUTRAL, mode="before")
    @classmethod
    def neutral(cls, value, info: ValidationInfo):
        want = NEUTRAL[info.field_name]
        empty = value in ([], {}) and info.field_name in ("stop", "logit_bias")
        if value is None or empty or value == want and isinstance(value, bool) == isinstance(want, bool):
            return None
        raise ValueError(f"{info.field_name}={value!r} is not supported (only {want!r})")


class CompletionRequest(Request):
    """/v1/completions: one prompt, text or token ids; `logprobs` asks for each token's log-probability and the
    likeliest alternatives, `echo` for the prompt's too (then max_tokens may be 0: the prompt scored alone)."""
    prompt: str | list[int]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def one_prompt(cls, value):
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            value = value[0]  # a batch of one prompt
        if not value or not isinstance(value, (str, list)) or isinstance(value, list) and \
                not all(type(t) is int for t in value):
            raise ValueError(PROMPT)
        return value


class TextPart(BaseModel):
    """One part of a message's content in OpenAI's list form (what GuideLLM sends); text is the only kind served."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]

    def text(self) -> str:
        """The content as text: a list's parts joined as they come."""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatRequest(Request):
    """/v1/chat/completions: the conversation so far; `max_completion_tokens` is OpenAI's newer name for max_tokens."""
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: int | None = None  # unset: as many as the context leaves, as OpenAI's and vLLM's chat take it
    max_completion_tokens: int | None = None
    logprobs: Literal[False] | None = None  # a chat's log-probabilities are not served: only "none" is taken

    def prompt_text(self) -> str:
        """The messages as the one prompt a model without a chat template is given, and the reply's start."""
        return "".join(CHAT_TEMPLATE.format(role=m.role, content=m.text()) for m in self.messages) + "assistant: "


@dataclass
class Completion:
    """A request as the engine takes it."""
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stream: bool
    usage_chunk: bool  # stream_options.include_usage: a last chunk with the token counts
    token_ids: bool  # the generated ids beside the text
    logprobs: int | None = None  # each token's log-probability and this many alternatives, where asked
    as_ids: bool = False  # the logprobs' tokens named "token_id:N": bytes that are no text alone stay apart
    echo: bool = False  # the prompt's text (and, with logprobs, its tokens' log-probabilities) before the completion's
    chat: bool = False  # a chat completion: its reply as a message, streamed as deltas
    min_tokens: int = 0  # the tokens before an EOS may end it: max_tokens where the client asked to ignore EOS
    ignore_eos: bool = False
    id: str = field(default_factory=lambda: f"cmpl-{secrets.token_hex(8)}")


def one_line(e: ValidationError) -> str:
    """pydantic's first complaint as the one line a 400 carries."""
    error = e.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if error["type"] == "model_type" and not error["loc"]:
        return f"the body must be a JSON object, got {type(error['input']).__name__}"
    if error["type"] == "value_error":
        return error["msg"].removeprefix("Value error, ")
    return f"{where}: {error['msg'][:1].lower()}{error['msg'][1:]}, got {error['input']!r}"


def parse(body, tokenizer, sut, model_id: str, chat: bool = False) -> Completion:
    """A /v1/completions (or, with `chat`, /v1/chat/completions) body as the engine takes it: BadRequest (one line)
    for anything it would not answer as asked (404 for a model it does not serve)."""
    try:
        req = (ChatRequest if chat else CompletionRequest).model_validate(body)
    except ValidationError as e:
        raise BadRequest(one_line(e)) from None
    max_tokens = req.max_completion_tokens if chat and req.max_completion_tokens is not None else req.max_tokens
    if req.model is not None and req.model != model_id:
        raise BadRequest(f"model {req.model!r} is not served here (this server serves {model_id!r})", 404)
    prompt = req.prompt_text() if chat else req.prompt
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    if max_tokens is None:
        max_tokens = max(1, sut.target.config.block_size - len(ids))
    if req.min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({req.min_tokens}) must not exceed max_tokens ({max_tokens})")
    echo, logprobs = (False, None) if chat else (req.echo, req.logprobs)
    if logprobs is not None and req.stream:
        raise BadRequest("logprobs are served whole, not streamed: give stream false")
    if max_tokens == 0 and not echo:
        raise BadRequest("max_tokens 0 scores the prompt alone: give echo true (and logprobs)")
    try:
        sut.check(ids, max(1, max_tokens))
        greedy = 0 <= req.temperature < GREEDY_BELOW
        params = SamplingParams(0.0 if greedy else req.temperature, 0 if req.top_k == -1 else req.top_k, req.top_p,
                                secrets.randbelow(2 ** 63) if req.seed is None else req.seed)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return Completion(ids, max_tokens, params, req.stream,
                      usage_chunk=bool(req.stream_options and req.stream_options.include_usage),
                      token_ids=req.return_token_ids or req.return_tokens, logprobs=logprobs, echo=echo, chat=chat,
                      as_ids=req.return_tokens_as_token_ids,
                      min_tokens=max_tokens if req.ignore_eos else req.min_tokens, ignore_eos=req.ignore_eos)
