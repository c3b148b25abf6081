"""docker-compose.yml: valid for compose (the file and each profile), and it says what the issue asks: ports on
127.0.0.1 only, a GPU reservation, the trainer after a ready service, the CPU profile's bandit against the CPU
service, every server setting passed through from .env and every variable documented in the env example."""

import json
import re
import shutil
from pathlib import Path, PurePosixPath

import pytest

from tests.deploy.checks import PROFILES, ROOT, compose_config, server_setting_names

COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / "deploy/setpo.env.example"


def config(profile: str | None, env_file=ENV_EXAMPLE) -> dict:
    result = compose_config(COMPOSE, profile, env_file, output_json=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profile", [None, *PROFILES])
@pytest.mark.parametrize("env_file", [ENV_EXAMPLE, None], ids=["env-example", "no-env-file"])
def test_compose_config_is_valid(profile, env_file):
    result = compose_config(COMPOSE, profile, env_file)
    assert result.returncode == 0, result.stderr


def test_each_profile_starts_its_own_stack():
    services = {profile: set(config(profile)["services"]) for profile in PROFILES}
    assert services == {
        "cpu": {"setpo-server-cpu", "bandit"},
        "gpu": {"setpo-server", "trainer"},
        "monitoring": {"prometheus"},
    }
    # The env example's COMPOSE_PROFILES makes a bare `docker compose up` the GPU stack.
    assert set(config(None)["services"]) == {"setpo-server", "trainer"}


def test_ports_are_published_on_localhost_only():
    for profile in PROFILES:
        for name, service in config(profile)["services"].items():
            for port in service.get("ports", []):
                assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port} beyond 127.0.0.1"


def test_gpu_service_reserves_a_gpu_and_trainer_waits_until_it_is_ready():
    services = config("gpu")["services"]
    devices = services["setpo-server"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device["capabilities"] for device in devices)
    trainer = services["trainer"]
    assert trainer["depends_on"]["setpo-server"]["condition"] == "service_healthy"
    # the service by its compose name, resolved by the client to every replica's address (--scale)
    assert trainer["environment"]["SETPO_URL"] == "dns:///setpo-server:8000"
    # a Ray head, then the recipe named by SETPO_RECIPE ($$ is compose's escape: the shell expands it)
    assert trainer["entrypoint"] == ["bash", "-c"]
    assert trainer["command"][0].startswith("ray start --head ")
    assert trainer["command"][0].endswith('&& exec bash "/opt/setpo/recipes/$${SETPO_RECIPE}.sh"')
    assert trainer["environment"]["SETPO_RECIPE"] == "grpo_gsm8k"


def test_cpu_profile_runs_the_bandit_against_the_cpu_service():
    services = config("cpu")["services"]
    bandit = services["bandit"]
    assert bandit["build"]["target"] == "experiments"
    assert bandit["command"][:2] == ["--url", "dns:///setpo-server-cpu:8000"]
    assert "setpo-server-cpu" in bandit["depends_on"]
    assert "deploy" not in services["setpo-server-cpu"], "the CPU profile must not reserve a GPU"


@pytest.mark.parametrize("published, expected", [("", None), ("8123", "8123")], ids=["scalable", "fixed"])
def test_an_empty_publish_port_lets_the_servers_scale(tmp_path, published, expected):
    """`SETPO_PUBLISH_PORT= docker compose up --scale setpo-server-cpu=2`: no fixed host port (two replicas cannot
    share one), each on a free 127.0.0.1 port; a port given, or the default 8000, is published as before."""
    env_file = tmp_path / "setpo.env"
    env_file.write_text(ENV_EXAMPLE.read_text() + f"SETPO_PUBLISH_PORT={published}\n")
    for profile, name in (("cpu", "setpo-server-cpu"), ("gpu", "setpo-server")):
        (port,) = config(profile, env_file)["services"][name]["ports"]
        assert (port["host_ip"], port["target"], port.get("published")) == ("127.0.0.1", 8000, expected)
    (port,) = config("cpu")["services"]["setpo-server-cpu"]["ports"]
    assert port["published"] == "8000"


def test_every_server_setting_passes_through_from_env():
    # SETPO_HOST/PORT are fixed by the images (0.0.0.0:8000 inside the container), everything else comes from .env.
    expected = server_setting_names() - {"SETPO_HOST", "SETPO_PORT"}
    for name in ("setpo-server", "setpo-server-cpu"):
        service = config("gpu" if name == "setpo-server" else "cpu")["services"][name]
        passed = {key for key in service["environment"] if key.startswith("SETPO_")}
        assert passed == expected, f"{name}: missing {sorted(expected - passed)}, unknown {sorted(passed - expected)}"


def test_env_example_documents_every_variable_compose_reads():
    text = COMPOSE.read_text()
    interpolated = set(re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)", text))
    passed_through = set(re.findall(r"^\s+- ([A-Z_][A-Z0-9_]*)$", text, flags=re.M))
    documented = set(re.findall(r"^#?\s*([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), flags=re.M))
    assert interpolated | passed_through <= documented, (
        f"not in {ENV_EXAMPLE.name}: {sorted((interpolated | passed_through) - documented)}"
    )
    assert server_setting_names() - {"SETPO_HOST", "SETPO_PORT"} <= documented


def test_servers_mount_the_folder_of_the_key_file_the_env_example_names():
    """Issue 41: SETPO_API_KEY_FILE's folder is bind-mounted read-only (the folder, so a file replaced on the host is
    seen), from deploy/keys by default, a folder git keeps empty of keys."""
    example = dict(re.findall(r"^#?\s*([A-Z_][A-Z0-9_]*)=(\S*)", ENV_EXAMPLE.read_text(), flags=re.M))
    key_file = PurePosixPath(example["SETPO_API_KEY_FILE"])
    for profile, name in (("gpu", "setpo-server"), ("cpu", "setpo-server-cpu")):
        service = config(profile)["services"][name]
        (mount,) = [v for v in service["volumes"] if v["target"] == str(key_file.parent)]
        assert mount["type"] == "bind" and mount["read_only"], name
        assert Path(mount["source"]) == ROOT / example["SETPO_KEYS"], name
    assert (ROOT / "deploy/keys/.gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]


def test_env_example_bakes_in_no_key():
    values = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)=(.*)$", ENV_EXAMPLE.read_text(), flags=re.M))
    assert values["SETPO_API_KEY"] == ""


@pytest.mark.parametrize(
    "breakage",
    [
        ("condition: service_healthy", "condition: service_healty"),  # a misspelt depends_on condition
        (
            "    read_only: true\n    tmpfs: [/tmp]\n    cap_drop: [ALL]\n    security_opt: [no-new-privileges:true]\n    restart: unless-stopped\n\n  trainer:",
            "    read_only: true\n    tmpfs: [/tmp]\n    cap_drop: [ALL]\n    security_opt: [no-new-privileges:true]\n    restart: unless-stopped\n    portz: [8000]\n\n  trainer:",
        ),  # an unknown key
        (
            "setpo-server-cpu:\n        condition: service_started",
            "setpo-server-gpu:\n        condition: service_started",
        ),  # depends on no service
    ],
    ids=["bad-condition", "unknown-key", "missing-dependency"],
)
def test_a_broken_compose_file_fails_the_check(tmp_path, breakage):
    old, new = breakage
    text = COMPOSE.read_text()
    assert old in text, "the test's anchor text moved: update the test"
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    profile = "cpu" if "setpo-server-gpu" in new else "gpu"
    result = compose_config(broken, profile, tmp_path / "deploy/setpo.env.example")
    assert result.returncode != 0, f"compose accepted a broken file ({new!r})"
