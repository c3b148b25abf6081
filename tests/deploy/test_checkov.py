"""checkov on the rendered manifests (each overlay with the monitoring and KEDA components, and the RayJob) and on every
Dockerfile. The checks that fail without skips must be exactly those in deploy/lint-skips.yaml: a new finding
fails the suite, and so does a skip that no longer fires. A broken copy must produce a finding."""

import shutil
from pathlib import Path

import pytest

from tests.deploy.checks import DOCKERFILES, OVERLAYS, ROOT, SKIPS, checkov, kustomize
from tests.deploy.test_k8s import K8S, with_components


def rendered_files(tmp_path: Path) -> list[Path]:
    """Each overlay with the monitoring and KEDA components, and the RayJob, rendered to files for checkov."""
    files = []
    overlays = [(o, with_components(tmp_path / o.replace("/", "-"), o, "monitoring", "keda")) for o in OVERLAYS]
    for target, directory in overlays + [("rayjob", K8S / "rayjob")]:
        result = kustomize(directory)
        assert result.returncode == 0, result.stderr
        files.append(tmp_path / f"{target.replace('/', '-')}.yaml")
        files[-1].write_text(result.stdout)
    return files


def test_every_skip_has_a_reason():
    for tool in ("checkov", "hadolint"):
        for check, reason in SKIPS[tool].items():
            assert isinstance(reason, str) and len(reason.split()) >= 15, f"{tool} {check}: say why it is skipped"


def test_checkov_finds_exactly_the_skipped_checks(tmp_path):
    files = rendered_files(tmp_path) + [ROOT / d for d in DOCKERFILES]
    status, failed = checkov(files)
    assert status == 0 and not failed, "\n".join(f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in failed)
    _, unskipped = checkov(files, skips=[])
    fired = {c["check_id"] for c in unskipped}
    assert fired == set(SKIPS["checkov"]), (
        f"new findings: {fired - set(SKIPS['checkov'])}; stale skips: {set(SKIPS['checkov']) - fired}"
    )


@pytest.mark.parametrize(
    "relative, old, new, expected",
    [
        (
            "base/deployment.yaml",
            "            allowPrivilegeEscalation: false",
            "            allowPrivilegeEscalation: true",
            "CKV_K8S_20",
        ),
        (
            "base/deployment.yaml",
            "        runAsNonRoot: true\n        runAsUser: 10001",
            "        runAsNonRoot: false\n        runAsUser: 0",
            "CKV_K8S_23",
        ),
        (
            "base/deployment.yaml",
            "          livenessProbe:",
            "          lifecycle: {}\n          xlivenessProbe:",
            "CKV_K8S_8",
        ),
    ],
    ids=["privilege-escalation", "root", "no-liveness-probe"],
)
def test_a_weakened_manifest_fails_checkov(tmp_path, relative, old, new, expected):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    target = copy / relative
    assert old in target.read_text(), "the test's anchor text moved: update the test"
    target.write_text(target.read_text().replace(old, new, 1))
    result = kustomize(copy / "overlays/cpu")
    rendered = tmp_path / "cpu.yaml"
    rendered.write_text(result.stdout)
    status, failed = checkov([rendered])
    assert status != 0 and expected in {c["check_id"] for c in failed}


def test_a_dockerfile_without_user_fails_checkov(tmp_path):
    text = (ROOT / "services/embedding_server/Dockerfile.gpu").read_text()
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace("USER 10001:10001\n", ""))
    status, failed = checkov([broken])
    assert status != 0 and "CKV_DOCKER_3" in {c["check_id"] for c in failed}
