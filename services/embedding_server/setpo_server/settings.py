"""Every knob of the service: SETPO_* environment variables, or `setpo-server --flag` (flags win; docs/service.md lists each).

Each field's docstring is its `--help` text (pydantic-settings' CLI, which also prints the variable and default).
"""

import inspect
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, CliSuppress, NoDecode, SettingsConfigDict

from setpo_core.diversity import SHAPES
from setpo_server import MIN_GROUP
from setpo_server.api_keys import parse_keys, read_key_file


class Settings(BaseSettings):
    """The diversity service for SetPO (docs/service.md). Every flag is also a SETPO_* variable (flags win).
    SETPO_API_KEY, from the environment only: the bearer key clients must send (unset: no key needed, unless
    SETPO_API_KEY_FILE is set).
    setpo-server --version prints the version.
    """

    model_config = SettingsConfigDict(
        env_prefix="SETPO_",
        extra="forbid",
        use_attribute_docstrings=True,
        cli_prog_name="setpo-server",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_show_env_vars=True,
    )

    # Model
    model: str = ""
    """Any sentence-transformers model path or hub id; empty = the embedded all-MiniLM-L6-v2 (offline). The paper's: Qwen/Qwen3-Embedding-0.6B."""
    served_model_name: Annotated[list[str], NoDecode] = []
    """Names the server answers to as the model (repeat the flag, or comma-separate); the first names answers. Default: the model's own name."""
    device: str = "auto"
    """auto = cuda when present, else cpu; or any torch device string (cuda:1)."""
    # auto measures on CPU: bfloat16 is faster on some CPUs and slower on others (docs/benchmarks.md, precision.py)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """auto = float16 on CUDA; on CPU bfloat16 where the CPU runs it natively and a probe at start measures it faster and within bf16-min-cosine of float32, else float32 (/info says which and why)."""
    bf16_min_cosine: Annotated[float, Field(gt=0, le=1)] = 0.9995
    """auto on CPU: bfloat16 is kept only if every probe embedding is within this cosine of float32's."""
    dtype_probe_cache: Path | None = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "setpo/dtype-probe.json"
    )
    """auto on CPU: the file that keeps the probe's measurement for this CPU, thread count, torch and model, so a restart skips it (seconds); empty = probe at every start."""
    truncation_side: Literal["right", "left"] = "right"
    """Which end of an over-long text is cut."""
    # little or no gain on the CPUs measured, and a slower start (docs/benchmarks.md, "Compiled forward passes")
    compile: bool = False
    """torch.compile the model, weights frozen into the graph (needs a C++ compiler on CPU, Triton on CUDA)."""
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Threads for torch, OpenMP and the tokenizer; auto = the container's CPU quota (cgroup), else the usable cores."""

    # Batching and admission
    max_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Padded tokens per forward pass; auto = 2048 on CPU in float32, 4096 in bfloat16, 16384 on CUDA."""
    max_queue_texts: int = Field(65536, ge=1)
    """Texts admitted and not yet embedded; beyond this a request gets 429 with Retry-After."""
    max_queue_tokens: int = Field(4_194_304, ge=1)
    """Tokens admitted and not yet embedded; beyond this a request gets 429 with Retry-After (an empty queue admits any legal request)."""
    max_concurrent_requests: int = Field(32, ge=1)
    """Data requests (/v1/*) in progress at once, an answer its caller has not taken yet counted as one; beyond this 503 with Retry-After, before the body is read."""
    max_requests_per_caller: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Of those, what one caller (a key's name) may hold; beyond this 503 with Retry-After, before the body is read. auto = half of SETPO_MAX_CONCURRENT_REQUESTS (rounded up) once the keys name two or more callers, so one caller's stalled bodies or unread answers cannot take every place; all of them otherwise."""
    forward_timeout: float = Field(120.0, gt=0)
    """Seconds one forward pass may run before the device is taken to be stuck: waiting requests get 503, /ready turns 503 and the process exits 1 (to be restarted)."""
    receive_timeout: float = Field(30.0, gt=0)
    """Seconds a caller has to send its whole body; a slower or stalled sender gets 408."""
    header_timeout: float = Field(10.0, gt=0)
    """Seconds a caller has to send a request's headers, from connecting or the request's first byte; then 408 and the connection is closed."""
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    """Bytes of one request's line and headers (nginx 8-32 KiB, TEI 8 KiB); then 431 and the connection is closed."""
    write_timeout: float = Field(30.0, gt=0)
    """Seconds an answer may wait for a caller that stopped reading it; then it is dropped with the connection."""
    max_connections: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Client connections held at once; auto = the descriptor limit (ulimit -n) less 64. At the limit the longest-idle connection is closed; if all are busy, 503."""

    # Request limits (413 for the body, 422 for the rest, each naming the setting)
    max_groups: int = Field(4096, ge=1)
    """Groups in one /v1/diversity request."""
    max_group_size: int = Field(256, ge=MIN_GROUP)
    """Members of one group."""
    max_request_rows: int = Field(16384, ge=MIN_GROUP)
    """Texts plus embedding rows in one /v1/diversity request, duplicates included."""
    max_embedding_inputs: int = Field(2048, ge=1)
    """Inputs of one /v1/embeddings request, duplicates included (OpenAI's own limit)."""
    max_text_chars: int = Field(100_000, ge=1)
    """Characters of one text; the server then cuts it to 10 characters per model token before tokenising."""
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Bytes of one request body (a body of numbers takes many times its size while it parses: docs/reliability.md)."""
    max_response_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    """Bytes an answer may take, estimated before the work (2048 MiniLM embeddings as JSON floats are ~17 MB)."""

    # SetPO
    weight: float = Field(0.05, ge=0, allow_inf_nan=False)
    """lambda when a request gives none (paper: GRPO 0.05)."""
    shape: str = "neg_log1p"
    """g(x) of the set score; see setpo_core.diversity.SHAPES."""

    # A secret never goes on a command line (ps, shell history): the environment or a Secret only.
    api_key: CliSuppress[SecretStr | None] = None
    """When set, /info, /v1/* and the API docs (/openapi.json, /docs, /redoc) need 'Authorization: Bearer <key>'."""
    api_key_file: Path | None = None
    """A file of keys, one a line: name=key, or a bare key (named key-<line number>); re-read within seconds of a change, so keys rotate without a restart. Either file or SETPO_API_KEY is accepted."""
    public_docs: bool = False
    """With a key set: serve /openapi.json, /docs and /redoc without it."""

    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = Field(8000, ge=0, le=65535)
    """Port to bind."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the service and uvicorn; /health, /ready and /metrics requests are logged at debug only."""
    log_format: Literal["text", "json"] = "text"
    """text: 'time LEVEL logger: message'; json: one object a line (time, level, logger, message)."""

    @field_validator("served_model_name", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        return [name.strip() for name in value.split(",") if name.strip()] if isinstance(value, str) else value

    @field_validator("shape")
    @classmethod
    def _known_shape(cls, shape: str) -> str:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
        return shape

    @field_validator("api_key")
    @classmethod
    def _empty_key_means_off(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not (key.get_secret_value().isascii() and key.get_secret_value().isprintable()):
            # HTTP headers carry latin-1 and clients send ASCII: such a key could never be presented
            raise ValueError("must be printable ASCII (an HTTP header carries it); choose another key")
        return key if key is not None and key.get_secret_value() else None

    @field_validator("api_key_file", "dtype_probe_cache", mode="before")
    @classmethod
    def _empty_file_means_none(cls, path: object) -> object:
        return None if path == "" else path  # as SETPO_API_KEY: compose passes an empty .env value through

    @field_validator("api_key_file")
    @classmethod
    def _keys_in_file(cls, path: Path | None) -> Path | None:
        # At start a key file must give keys: later a broken one keeps the keys in force (api_keys.py); here there are none
        if path is not None:
            try:
                parse_keys(read_key_file(path))
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror}") from None
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
        return path


Settings.__doc__ = inspect.cleandoc(Settings.__doc__ or "")  # --help prints the class docstring as written
