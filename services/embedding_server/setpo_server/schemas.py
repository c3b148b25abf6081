"""The HTTP contract (v1.1, compatible with v1) as pydantic models, the source of truth of /openapi.json (the client's
types are tested against it), and the one place a request's content is refused: a body parses with `Served` as its
validation context, and each request's `_within_limits` holds it to the settings' limits and the contract's rules
between fields, naming the field at fault (`Refused`: 422, or 400 on /v1/embeddings).
"""

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from setpo_server import MIN_GROUP
from setpo_server.settings import Settings

# JSON numbers only (strict: no "1.5" strings, no booleans), and never NaN or infinity.
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# The widest embedding row accepted (4x today's widest embedders), checked while the body parses: a group's rows never
# hold more than 256 x 16384 Python floats (docs/reliability.md).
MAX_EMBEDDING_DIM = 16384
# The most one member of a /v1/diversity answer takes: four numbers of at most 24 characters with separators (5 x 24)
# and a share of its group's own 160 bytes (MIN_GROUP members or more). /info's max_request_rows is sized by it.
ANSWER_BYTES_PER_ROW = 5 * 24 + -(-160 // MIN_GROUP)
# Per /v1/embeddings vector beside its numbers: its index, the object's name and separators.
ANSWER_BYTES_PER_VECTOR = 48


@dataclass(frozen=True)
class Served:
    """What a body is held to as it parses (pydantic's validation context): the limits and the served model."""

    settings: Settings
    model_names: list[str]
    model_path: str
    dimension: int


class Refused(Exception):
    """A request over a limit or against the contract: `message` says what to do, `param` names the field at fault.
    Not a ValueError, so pydantic lets it through as it is rather than as one of its own errors."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def echoed(value: str, limit: int = 100) -> str:
    """Something the caller sent, quoted for an error message and cut to `limit` characters: an error names what is
    wrong, it never hands a caller's body back."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def max_request_rows(settings: Settings) -> int:
    """Rows one /v1/diversity request may carry: SETPO_MAX_REQUEST_ROWS, and as many as SETPO_MAX_RESPONSE_BYTES can
    answer (/info reports this, so a client packs by it alone)."""
    return min(settings.max_request_rows, settings.max_response_bytes // ANSWER_BYTES_PER_ROW)


def refuse_long_texts(texts: list[str] | list[str | None], settings: Settings, param: str) -> None:
    for j, text in enumerate(texts):
        if text is not None and len(text) > settings.max_text_chars:
            message = f"text has {len(text)} characters, more than SETPO_MAX_TEXT_CHARS={settings.max_text_chars}"
            raise Refused(message, f"{param}[{j}]")


Kernel = Literal["embedding", "hybrid", "key"]
Normalize = Literal["none", "zscore"]


class Group(BaseModel):
    """One prompt's responses: give `texts` (embedded by the server) or `embeddings` (used as given); with the
    `key` kernel, `keys` alone will do."""

    model_config = ConfigDict(extra="forbid", strict=True)

    texts: list[str] | None = Field(None, description="Responses to embed with the server's model.")
    embeddings: list[Annotated[list[Finite], Field(max_length=MAX_EMBEDDING_DIM)]] | None = Field(
        None, description="Precomputed embeddings, one row per response."
    )
    rewards: list[Finite] | None = Field(None, description="One reward per response; asks for shaped advantages.")
    keys: list[str | None] | None = Field(
        None,
        description="v1.1: a canonical solution identity per response (null: none); equal keys are one solution. "
        "Used by the 'hybrid' and 'key' kernels.",
    )

    @model_validator(mode="after")
    def _one_kind_of_member(self) -> "Group":
        if self.texts is not None and self.embeddings is not None:
            raise ValueError("give exactly one of 'texts' or 'embeddings'")
        if self.texts is None and self.embeddings is None and self.keys is None:
            raise ValueError("give exactly one of 'texts' or 'embeddings' (or, with kernel 'key', 'keys' alone)")
        size = self.size
        if size < MIN_GROUP:
            raise ValueError(f"has {size} members; leave-one-out marginals need at least {MIN_GROUP}")
        if self.embeddings is not None:
            dims = {len(row) for row in self.embeddings}
            if len(dims) > 1:
                raise ValueError(f"embeddings are ragged: rows have lengths {sorted(dims)}")
            if dims == {0}:
                raise ValueError("embeddings have no dimensions")
        if self.rewards is not None and len(self.rewards) != size:
            raise ValueError(f"has {size} members but {len(self.rewards)} rewards")
        if self.keys is not None and len(self.keys) != size:
            raise ValueError(f"has {size} members but {len(self.keys)} keys")
        if self.embeddings is not None:
            # an array at once: 8 bytes a value where a Python float takes 32 (docs/reliability.md); float64 so that
            # extreme norms survive until cosine_kernel scales each row
            self.embeddings = np.asarray(self.embeddings, dtype=np.float64)  # type: ignore[assignment]
        return self

    @property
    def size(self) -> int:
        members = next(m for m in (self.texts, self.embeddings, self.keys) if m is not None)  # the validator's order
        return len(members)


class DiversityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    groups: list[Group] = Field(min_length=1)
    weight: Annotated[Finite, Field(ge=0)] | None = Field(
        None, description="lambda in A^ = A + lambda * s; the server's SETPO_WEIGHT when omitted."
    )
    min_reward: Finite | None = Field(
        None,
        description="v1.1: score only the members whose reward is >= this (every group gives rewards); the others, "
        "and every group with fewer than 3 such members, get 0.",
    )
    kernel: Kernel | None = Field(
        None,
        description="v1.1: 'embedding' (the default; the paper: clamped cosine), 'hybrid' (1 for equal keys, cosine "
        "otherwise) or 'key' (1 for equal keys, 0 otherwise; nothing is embedded).",
    )
    normalize: Normalize | None = Field(
        None,
        description="v1.1: 'none' (the default; the paper) or 'zscore' (marginals standardised over the scored "
        "members).",
    )

    @model_validator(mode="after")
    def _within_limits(self, info: ValidationInfo) -> "DiversityRequest":
        """Contract v1.1's rules between fields, and, for a body (with its context), the limits; each refusal names
        the group or field at fault."""
        for b, group in enumerate(self.groups):
            if self.min_reward is not None and group.rewards is None:
                raise Refused(
                    "min_reward scores members by reward: give 'rewards' in every group", f"groups[{b}].rewards"
                )
            if self.kernel in (None, "embedding") and group.keys is not None:
                message = "'keys' are used only by kernel 'hybrid' or 'key'; the 'embedding' kernel (the default) ignores them"
                raise Refused(message, f"groups[{b}].keys")
            if self.kernel == "key" and group.keys is None:
                raise Refused(
                    "kernel 'key' compares members by key alone: give 'keys' in every group", f"groups[{b}].keys"
                )
            if self.kernel != "key" and group.texts is None and group.embeddings is None:
                raise Refused(f"kernel {self.kernel!r} embeds members: give 'texts' or 'embeddings'", f"groups[{b}]")
        if not isinstance(info.context, Served):
            return self  # built in code, not read from a body: no limits
        settings = info.context.settings
        if len(self.groups) > settings.max_groups:
            message = (
                f"request has {len(self.groups)} groups, more than SETPO_MAX_GROUPS={settings.max_groups}; split it"
            )
            raise Refused(message, "groups")
        for b, group in enumerate(self.groups):
            if group.size > settings.max_group_size:
                message = f"group has {group.size} members, more than SETPO_MAX_GROUP_SIZE={settings.max_group_size}"
                raise Refused(message, f"groups[{b}]")
            refuse_long_texts(group.texts or [], settings, f"groups[{b}].texts")
            refuse_long_texts(group.keys or [], settings, f"groups[{b}].keys")
        rows = sum(group.size for group in self.groups)
        if rows > (limit := max_request_rows(settings)):
            message = (
                f"request has {rows} texts and embedding rows, more than the {limit} this service takes "
                f"(SETPO_MAX_REQUEST_ROWS={settings.max_request_rows}; SETPO_MAX_RESPONSE_BYTES="
                f"{settings.max_response_bytes} at {ANSWER_BYTES_PER_ROW} bytes an answered row); split it"
            )
            raise Refused(message, "groups")
        return self

    @property
    def is_v1(self) -> bool:
        """Nothing of v1.1 asked for: the answer is exactly v1's (no `scored`, `bonus` or `weight`)."""
        v11 = (self.min_reward, self.kernel, self.normalize)
        return all(field is None for field in v11) and all(group.keys is None for group in self.groups)


class GroupResult(BaseModel):
    marginals: list[float] = Field(description="Leave-one-out marginal s_i of each response.")
    local_mass: list[float] = Field(description="Local mass m_i: mean similarity of each response to the others.")
    set_score: float = Field(description="Set score D(S) of the whole group.")
    saturation: float = Field(description="Share of response pairs with similarity above 0.95.")
    advantages: list[float] | None = Field(
        None, description="Shaped advantages A + lambda * s; present only when the group gave rewards."
    )
    scored: int | None = Field(
        None, description="v1.1: members scored (reward >= min_reward), or 0 when fewer than 3 (all marginals 0)."
    )
    bonus: list[float] | None = Field(
        None, description="v1.1: what is added to each advantage: weight x the (normalised) scoped marginals."
    )


class DiversityUsage(BaseModel):
    texts: int = Field(description="Texts in the request.")
    unique_texts: int = Field(description="Distinct texts, each embedded once.")
    tokens: int = Field(description="Tokens of all texts sent, after truncation.")
    truncated: int = Field(description="Texts cut to the model's maximum length.")


class DiversityResponse(BaseModel):
    model: str
    groups: list[GroupResult]
    usage: DiversityUsage
    weight: float | None = Field(None, description="v1.1: the lambda applied.")


class EmbeddingsRequest(BaseModel):
    """OpenAI-compatible embeddings request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: str | list[str]
    model: str | None = Field(None, description="Optional; must name the served model when given.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="Keep the first n dimensions and renormalise.")
    user: str | None = Field(None, description="Accepted for OpenAI compatibility; not used.")

    @field_validator("input", mode="before")
    @classmethod
    def _no_token_ids(cls, value: object) -> object:
        if isinstance(value, list) and value and not isinstance(value[0], str):
            raise ValueError("token-id input is not supported; send text (a string or a list of strings)")
        if isinstance(value, list) and not value:
            raise ValueError("input is an empty list; send at least one string")
        return value

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input

    @model_validator(mode="after")
    def _within_limits(self, info: ValidationInfo) -> "EmbeddingsRequest":
        """For a body (with its context): the served model, its width, and the limits; each refusal names the field."""
        if not isinstance(info.context, Served):
            return self
        served, settings = info.context, info.context.settings
        if self.model is not None and self.model not in (*served.model_names, served.model_path):
            names = " / ".join(map(repr, served.model_names))
            raise Refused(f"this server serves model {names}, not {echoed(self.model)}", "model")
        if self.dimensions is not None and self.dimensions > served.dimension:
            raise Refused(f"dimensions={self.dimensions} is more than the model's {served.dimension}", "dimensions")
        texts = self.texts
        if len(texts) > settings.max_embedding_inputs:
            message = (
                f"input has {len(texts)} texts, more than SETPO_MAX_EMBEDDING_INPUTS={settings.max_embedding_inputs}; "
                "split it"
            )
            raise Refused(message, "input")
        refuse_long_texts(texts, settings, "input")
        dims = self.dimensions or served.dimension
        # base64 of float32 is 4 * ceil(4 d / 3) characters; a JSON float at most 24
        per_vector = 4 * -(-4 * dims // 3) if self.encoding_format == "base64" else 24 * dims
        estimate = len(texts) * (per_vector + ANSWER_BYTES_PER_VECTOR)
        if estimate > settings.max_response_bytes:
            base64 = "ask for encoding_format 'base64', " if self.encoding_format == "float" else ""
            message = (
                f"the answer would take about {estimate} bytes, more than SETPO_MAX_RESPONSE_BYTES="
                f"{settings.max_response_bytes}; {base64}send fewer inputs, or split the request"
            )
            raise Refused(message, "input")
        return self


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="Floats, or base64 of little-endian float32 bytes.")


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    truncated: int = Field(description="Texts cut to the model's maximum length.")


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class Model(BaseModel):
    """OpenAI's model object, so OpenAI-compatible tools find the served model."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="When this server loaded the model (Unix seconds).")
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class Limits(BaseModel):
    max_groups: int
    max_group_size: int
    max_request_rows: int = Field(
        description="Texts plus embedding rows in one /v1/diversity request, duplicates included."
    )
    max_embedding_inputs: int = Field(description="Inputs of one /v1/embeddings request.")
    max_text_chars: int
    max_body_bytes: int
    max_batch_tokens: int
    max_queue_texts: int
    max_queue_tokens: int
    max_concurrent_requests: int
    max_requests_per_caller: int = Field(
        description="Of max_concurrent_requests, what the caller asking may hold (SETPO_MAX_REQUESTS_PER_CALLER, auto "
        "resolved against the keys in force)."
    )
    receive_timeout: float
    header_timeout: float
    max_header_bytes: int
    write_timeout: float
    max_response_bytes: int


class Info(BaseModel):
    version: str
    contract: str = Field(description="Version of the HTTP contract of /v1/diversity this server speaks.")
    model: str
    model_path: str
    dimension: int
    max_tokens: int
    device: str
    dtype: str
    dtype_reason: str = Field(
        description="Why this dtype: SETPO_DTYPE=... as set, or auto's decision (on CPU with its measured speed-up "
        "and worst cosine to float32, e.g. 'auto: bfloat16 (native amx_bf16, 2.9x, min cos 0.99996)')."
    )
    compiled: bool = Field(description="SETPO_COMPILE: the model runs through torch.compile")
    threads: int = Field(description="Threads torch, OpenMP and the tokenizer use (SETPO_THREADS, else the CPU quota).")
    truncate_chars: int = Field(description="Characters of each text kept before tokenising (10 per model token).")
    truncation_side: str
    shape: str
    default_weight: float
    limits: Limits


class ErrorDetail(BaseModel):
    message: str = Field(description="What is wrong and, where it helps, what to do.")
    type: str
    param: str | None = Field(None, description="The field or group at fault, e.g. groups[2].rewards.")
    code: str | None = Field(None, description="OpenAI's error code field; always null here.")


class ErrorResponse(BaseModel):
    error: ErrorDetail
