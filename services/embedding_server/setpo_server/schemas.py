"""The HTTP contract (v1.1, compatible with v1), once: request and response bodies as pydantic models.

These models are the source of truth. FastAPI publishes them in /openapi.json, and the client's own types
are tested against that schema (tests/client/test_schema_drift.py).
"""

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# JSON numbers only (strict: no "1.5" strings, no booleans), and never NaN or infinity.
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# The widest embedding row accepted: 4x today's widest embedders. Checked while the body parses, so one group's
# rows never hold more than 256 x 16384 Python floats before they become an array (docs/reliability.md).
MAX_EMBEDDING_DIM = 16384


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
        if size < 3:
            raise ValueError(f"has {size} members; leave-one-out marginals need at least 3")
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
            # (G, d) float64 as soon as the group is valid: 8 bytes a value where a Python float list holds 32, so
            # a body of embeddings parses in about half the memory (docs/reliability.md); float64 so extreme norms
            # survive until cosine_kernel scales each row.
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
