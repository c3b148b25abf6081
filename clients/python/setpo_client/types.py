"""The wire types of the setpo HTTP contract (v1.1, compatible with v1), as the client sees them.

The server's pydantic models are the source of truth; tests/client/test_schema_drift.py checks that every
model here has the same fields, types and required set as the server's /openapi.json, but for the fields a newer server
reports and an older one lacks ("newer servers only"): optional here, so this client works with both. Responses ignore
unknown fields, so a newer server that adds a field does not break an older client, and are read strictly: a number is
a JSON number, never a string or a boolean converted (a replica that answers so is off the contract).
"""

import base64
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Kernel = Literal["embedding", "hybrid", "key"]
Normalize = Literal["none", "zscore"]
Advantage = Literal["framework", "maxrl", "w_reinforce"]  # the base: the framework's own, or setpo_core.advantages
Combine = Literal["add", "reshare"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field fails here, before any network call


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class Group(_Request):
    """One prompt's responses: `texts` (embedded by the server) or `embeddings`; `rewards` for advantages;
    `keys` (v1.1) a solution identity per response for the 'hybrid' and 'key' kernels."""

    texts: list[str] | None = None
    embeddings: list[list[float]] | None = None
    rewards: list[float] | None = None
    keys: list[str | None] | None = None


class DiversityRequest(_Request):
    groups: list[Group]
    weight: float | None = None
    # v1.1; left out of the body when None, so a v1 request stays a v1 request
    min_reward: float | None = None
    kernel: Kernel | None = None
    normalize: Normalize | None = None


class GroupResult(_Response):
    marginals: list[float]
    local_mass: list[float]
    set_score: float
    saturation: float
    advantages: list[float] | None = None
    scored: int | None = None  # v1.1 answers only
    bonus: list[float] | None = None  # v1.1 answers only: what is added to each advantage


class DiversityUsage(_Response):
    texts: int
    unique_texts: int
    tokens: int
    truncated: int


class DiversityResponse(_Response):
    model: str
    groups: list[GroupResult]
    usage: DiversityUsage
    weight: float | None = None  # v1.1 answers only: the lambda applied


class EmbeddingsRequest(_Request):
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class Embedding(_Response):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str

    def floats(self) -> list[float]:
        """The vector as floats, decoding base64 (little-endian float32) when that was asked for."""
        if isinstance(self.embedding, list):
            return self.embedding
        raw = base64.b64decode(self.embedding)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))


class EmbeddingsUsage(_Response):
    prompt_tokens: int
    total_tokens: int
    truncated: int


class EmbeddingsResponse(_Response):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class Model(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[Model]


class Limits(_Response):
    max_groups: int
    max_group_size: int
    max_text_chars: int
    max_body_bytes: int
    max_batch_tokens: int
    max_queue_texts: int
    # newer servers only: None from an older one; the shaper then splits by max_groups and body size alone
    max_request_rows: int | None = None
    max_embedding_inputs: int | None = None
    max_queue_tokens: int | None = None
    max_concurrent_requests: int | None = None
    max_requests_per_caller: int | None = None
    receive_timeout: float | None = None
    header_timeout: float | None = None
    max_header_bytes: int | None = None
    write_timeout: float | None = None
    max_response_bytes: int | None = None


class Info(_Response):
    version: str
    model: str
    model_path: str
    dimension: int
    max_tokens: int
    device: str
    dtype: str
    compiled: bool
    truncation_side: str
    shape: str
    default_weight: float
    limits: Limits
    threads: int | None = None  # newer servers only
    # newer servers only: the HTTP contract version ("1.1"); None from a v1 server. Numbers only: a replica saying
    # "1.1-rc1" is off the contract, left out like one whose /info cannot be read, not a crash when versions compare.
    contract: str | None = Field(None, pattern=r"^\d+(\.\d+)+$")
    truncate_chars: int | None = None  # newer servers only: characters of each text the server keeps
    dtype_reason: str | None = None  # newer servers only: why this dtype (SETPO_DTYPE as set, or auto's measurement)


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorDetail
