"""The Dockerfiles: hadolint clean (skips only from deploy/lint-skips.yaml, each still needed), and what the issue
asks of every image that a linter does not check: a non-root numeric user, a healthcheck on /ready for the
services, versioned base images, no secrets baked in, dependencies installed before our code is copied, and
every COPY source present in the build context."""

import re

import pytest

from tests.deploy.checks import DOCKERFILES, ROOT, SKIPS, hadolint, hadolint_codes

SERVICE_DOCKERFILES = ["services/embedding_server/Dockerfile", "services/embedding_server/Dockerfile.gpu"]


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / dockerfile).read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def final_stage(dockerfile: str) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_passes(dockerfile):
    result = hadolint(ROOT / dockerfile)
    assert result.returncode == 0, f"hadolint {dockerfile}: {result.stdout}"


def test_every_hadolint_skip_is_still_needed():
    fired = set().union(*(hadolint_codes(hadolint(ROOT / d, skips=[])) for d in DOCKERFILES))
    assert set(SKIPS["hadolint"]) <= fired, (
        f"skipped but never fired, remove from deploy/lint-skips.yaml: {set(SKIPS['hadolint']) - fired}"
    )


@pytest.mark.parametrize(
    "line",
    ["RUN pip install --no-cache-dir requests", "RUN cd /tmp && echo made", "FROM ubuntu:latest"],
    ids=["unpinned-pip", "cd-in-run", "latest-tag"],
)
def test_a_broken_dockerfile_fails_hadolint(tmp_path, line):
    broken = tmp_path / "Dockerfile"
    broken.write_text((ROOT / "services/embedding_server/Dockerfile").read_text() + f"\n{line}\n")
    result = hadolint(broken)
    assert result.returncode != 0, f"hadolint accepted {line!r}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_runs_as_a_numeric_non_root_user(dockerfile):
    users = [args for op, args in final_stage(dockerfile) if op == "USER"]
    assert users, f"{dockerfile}: the final stage sets no USER (it would run as root)"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 10000, (
        f"{dockerfile}: USER {users[-1]} (Kubernetes' runAsNonRoot needs a numeric uid; >= 10000 avoids host users)"
    )


@pytest.mark.parametrize("dockerfile", SERVICE_DOCKERFILES)
def test_service_image_healthcheck_probes_ready(dockerfile):
    checks = [args for op, args in final_stage(dockerfile) if op == "HEALTHCHECK"]
    assert len(checks) == 1 and "/ready" in checks[0], f"{dockerfile}: HEALTHCHECK must probe /ready"
    assert ("ENTRYPOINT", '["setpo-server"]') in final_stage(dockerfile)


def test_trainer_entry_point_is_setpo_train():
    assert ("ENTRYPOINT", '["setpo-train"]') in final_stage("services/trainer/Dockerfile")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_base_images_carry_a_version_tag(dockerfile):
    # FROM reads ARGs (so make test-deploy can use its own base): their defaults are what a user builds on.
    steps = instructions(dockerfile)
    args = dict(re.match(r"(\w+)=?(.*)", a).groups() for op, a in steps if op == "ARG")
    for op, source in steps:
        if op != "FROM":
            continue
        image = source.split()[0]
        match = re.fullmatch(r"\$\{?(\w+)\}?", image)
        if match:
            image = args[match.group(1)]
        elif image in {name for o, rest in steps if o == "FROM" for name in rest.split()[2:3]}:
            continue  # an earlier stage of this file
        assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), (
            f"{dockerfile}: base {image!r} needs a version tag"
        )


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_no_secret_is_baked_in(dockerfile):
    for op, args in instructions(dockerfile):
        if op in {"ENV", "ARG"}:
            assert not re.search(r"(API_KEY|TOKEN|PASSWORD|SECRET)", args, re.I), f"{dockerfile}: {op} {args}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dependencies_are_installed_before_our_code_is_copied(dockerfile):
    steps = instructions(dockerfile)
    first_code_copy = min(
        i for i, (op, args) in enumerate(steps) if op == "COPY" and re.match(r"(core|clients|services)/", args)
    )
    installs = [i for i, (op, args) in enumerate(steps) if op == "RUN" and "pip install" in args]
    assert installs and installs[0] < first_code_copy, (
        f"{dockerfile}: code is copied before the dependencies are installed"
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copy_sources_exist_and_are_in_the_build_context(dockerfile):
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for op, args in instructions(dockerfile):
        if op != "COPY" or args.startswith("--from"):
            continue
        source = args.split()[-2]
        assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}: no such path in the repository"
        assert source.split("/")[0] not in ignored, f"{dockerfile}: COPY {source}: excluded by .dockerignore"


def test_server_lock_pins_what_dev_lock_pins():
    # The images install requirements/server.lock; the tests run on requirements/dev.lock. They must agree.
    def pins(path: str) -> dict[str, str]:
        lines = [
            line.split("==")
            for line in (ROOT / path).read_text().splitlines()
            if "==" in line and not line.startswith("#")
        ]
        return {name.lower().replace("_", "-"): version for name, version in lines}

    server, dev = pins("requirements/server.lock"), pins("requirements/dev.lock")
    assert server, "requirements/server.lock pins nothing"
    assert {name: version for name, version in server.items() if dev.get(name) != version} == {}, "run make lock-server"
