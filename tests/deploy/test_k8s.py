"""deploy/k8s: every overlay (with and without the monitoring component) and the RayJob render with kustomize,
pass `kubernetes-validate --strict` on the oldest and newest Kubernetes we target, and their custom resources
pass our own schemas (deploy/validate_crds.py). Then what the manifests must mean: probes, resources, GPUs only
in the gpu overlay, selectors that match, the keys from a Secret mounted as a volume, a NetworkPolicy that lets in
exactly the trainer's pods, and a RayJob that reaches the service by its cluster DNS name. Broken copies must fail
each check."""

import re
import shutil
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.deploy.checks import (
    KUBERNETES_VERSIONS,
    OVERLAYS,
    ROOT,
    documents,
    exported_metrics,
    find,
    kubernetes_validate,
    kustomize,
    server_setting_names,
    validate_crds,
)

K8S = ROOT / "deploy/k8s"
RECIPES = ROOT / "services/trainer/recipes"


def with_components(tmp_path: Path, overlay: str, *components: str, k8s: Path = K8S) -> Path:
    """A copy of deploy/k8s (or of `k8s`) whose overlay has these components, as `kustomize edit add component` adds
    them."""
    copy = tmp_path / "k8s"
    shutil.copytree(k8s, copy)
    kustomization = copy / overlay / "kustomization.yaml"
    listed = "".join(f"  - ../../components/{component}\n" for component in components)
    kustomization.write_text(kustomization.read_text() + "components:\n" + listed)
    return copy / overlay


def render(directory: Path) -> str:
    result = kustomize(directory)
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("k8s")
    out = {overlay: render(K8S / overlay) for overlay in OVERLAYS}
    for overlay in OVERLAYS:
        out[f"{overlay}+monitoring"] = render(with_components(tmp / overlay.replace("/", "-"), overlay, "monitoring"))
        keda = with_components(tmp / f"{overlay.replace('/', '-')}-keda", overlay, "monitoring", "keda")
        out[f"{overlay}+keda"] = render(keda)
    out["rayjob"] = render(K8S / "rayjob")
    return out


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "target", [*OVERLAYS, *(f"{o}+monitoring" for o in OVERLAYS), *(f"{o}+keda" for o in OVERLAYS), "rayjob"]
)
def test_manifests_pass_strict_validation(rendered, target, version):
    result = kubernetes_validate(rendered[target], version)
    assert result.returncode == 0, result.stdout + result.stderr
    crds = validate_crds(rendered[target], version)
    assert crds.returncode == 0, crds.stdout + crds.stderr


def test_custom_resources_are_what_we_expect(rendered):
    # validate_crds must actually see them: a RayJob in rayjob, a ServiceMonitor with monitoring
    assert find(documents(rendered["rayjob"]), "RayJob")
    assert find(documents(rendered["overlays/gpu+monitoring"]), "ServiceMonitor")
    assert not [d for d in documents(rendered["overlays/gpu"]) if d["kind"] == "ServiceMonitor"], (
        "the ServiceMonitor is opt-in"
    )
    for overlay in OVERLAYS:
        assert find(documents(rendered[f"{overlay}+keda"]), "ScaledObject")
        assert not [d for d in documents(rendered[overlay]) if d["kind"] == "ScaledObject"], "KEDA is opt-in"


@pytest.mark.parametrize("target", [*OVERLAYS, *(f"{o}+keda" for o in OVERLAYS), "rayjob"])
def test_every_namespaced_object_is_in_the_setpo_namespace(rendered, target):
    """The overlays' own objects (the gpu overlay's model volume) and the components' too: one left without a
    namespace lands in the caller's current one, where the pods never see it."""
    for doc in documents(rendered[target]):
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "setpo", f"{target}: {doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_deployment_probes_resources_and_security(rendered, overlay):
    deployment = find(documents(rendered[overlay]), "Deployment", "setpo-server")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), f"{overlay}: {kind} must set cpu and memory"
    has_gpu = "nvidia.com/gpu" in container["resources"]["limits"]
    assert has_gpu == (overlay == "overlays/gpu"), f"{overlay}: GPUs belong to the gpu overlay only"
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert (
        container["securityContext"]["readOnlyRootFilesystem"]
        and not container["securityContext"]["allowPrivilegeEscalation"]
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["SETPO_HOST"]["value"] == "0.0.0.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_reads_its_keys_from_the_secret_mounted_as_a_volume(rendered, overlay):
    """Issue 41: the key file SETPO_API_KEY_FILE names is the Secret's `keys`, in a volume the kubelet updates in
    place (never a subPath, which it does not); no SETPO_API_KEY, whose key a rotation could never revoke."""
    pod = find(documents(rendered[overlay]), "Deployment", "setpo-server")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "SETPO_API_KEY" not in env
    key_file = PurePosixPath(env["SETPO_API_KEY_FILE"]["value"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(key_file.parent)]
    assert mount["readOnly"] and "subPath" not in mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "setpo-api-key"
    assert volume["secret"]["items"] == [{"key": "keys", "path": key_file.name}]
    assert volume["secret"]["defaultMode"] == 0o440, "read by the owner and the pod's fsGroup, no other user"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_configmap_holds_only_known_settings(rendered, overlay):
    docs = documents(rendered[overlay])
    deployment = find(docs, "Deployment", "setpo-server")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (source,) = container["envFrom"]
    configmap = find(docs, "ConfigMap", source["configMapRef"]["name"])  # the hashed name kustomize generated
    unknown = {k for k in configmap["data"] if k.startswith("SETPO_")} - server_setting_names()
    assert not unknown, f"{overlay}: not settings of setpo-server: {unknown}"
    assert configmap["data"]["SETPO_DEVICE"] == ("cuda" if overlay == "overlays/gpu" else "cpu")
    if overlay == "overlays/gpu":
        assert configmap["data"]["SETPO_MODEL"] == "Qwen/Qwen3-Embedding-0.6B"
        assert configmap["data"]["SETPO_MAX_BATCH_TOKENS"] == "65536"  # that model's measured budget


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_hpa_and_pdb_point_at_the_server(rendered, overlay):
    docs = documents(rendered[overlay])
    deployment = find(docs, "Deployment", "setpo-server")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = find(docs, "Service", "setpo-server")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    hpa = find(docs, "HorizontalPodAutoscaler", "setpo-server")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "setpo-server"}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in deployment["spec"], "the HPA owns replicas; a fixed count would fight it on every apply"
    pdb = find(docs, "PodDisruptionBudget", "setpo-server")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


# --- autoscaling on the service's queue (KEDA) --------------------------------------------------------------------


def queue_metrics(scaled_object: dict) -> list[str]:
    """The setpo metric names each trigger's Prometheus query reads."""
    return [
        name for t in scaled_object["spec"]["triggers"] for name in re.findall(r"setpo_\w+", t["metadata"]["query"])
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_scales_the_deployment_on_a_queue_gauge_the_service_exports(rendered, overlay):
    """With components/keda: one autoscaler (KEDA's; the base HPA removed), within the overlay's bounds, on a
    Prometheus query of a gauge setpo-server really exports, as the ServiceMonitor's scrape labels it."""
    docs = documents(rendered[f"{overlay}+keda"])
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"], "two autoscalers would fight"
    scaled = find(docs, "ScaledObject", "setpo-server")
    assert scaled["spec"]["scaleTargetRef"]["name"] == find(docs, "Deployment")["metadata"]["name"]
    hpa = find(documents(rendered[overlay]), "HorizontalPodAutoscaler", "setpo-server")  # the overlay's bounds
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (
        hpa["spec"]["minReplicas"],
        hpa["spec"]["maxReplicas"],
    )
    exported = exported_metrics()
    assert queue_metrics(scaled) == ["setpo_queue_tokens"]
    assert all(exported.get(name) == "Gauge" for name in queue_metrics(scaled)), f"not exported as a gauge: {exported}"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert float(trigger["metadata"]["threshold"]) > 0
    query = trigger["metadata"]["query"]
    assert 'namespace="setpo"' in query and f'service="{find(docs, "ServiceMonitor")["metadata"]["name"]}"' in query


def test_a_scaled_object_on_a_metric_the_service_does_not_export_fails(tmp_path):
    copy = broken_copy(tmp_path, "components/keda/scaledobject.yaml", "setpo_queue_tokens{", "setpo_queue_token{")
    scaled = find(
        documents(render(with_components(tmp_path / "keda", "overlays/cpu", "keda", k8s=copy))), "ScaledObject"
    )
    assert [name for name in queue_metrics(scaled) if name not in exported_metrics()] == ["setpo_queue_token"]


@pytest.mark.parametrize(
    "old, new",
    [("  minReplicaCount: 2", "  minReplicas: 2"), ('threshold: "16384"', "threshold: 16384")],
    ids=["hpa-field-name", "unquoted-threshold"],
)
def test_a_broken_scaled_object_fails_kedas_schema(tmp_path, old, new):
    copy = broken_copy(tmp_path, "components/keda/scaledobject.yaml", old, new)
    rendered = render(with_components(tmp_path / "keda", "overlays/cpu", "monitoring", "keda", k8s=copy))
    result = validate_crds(rendered)
    assert result.returncode == 1 and "ScaledObject" in result.stdout, f"KEDA's schema accepted {new.strip()!r}"


def test_network_policy_lets_in_only_the_trainer(rendered):
    server_pods = find(documents(rendered["overlays/gpu"]), "Deployment", "setpo-server")["spec"]["template"][
        "metadata"
    ]["labels"]
    policy = find(documents(rendered["overlays/gpu"]), "NetworkPolicy", "setpo-server")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= server_pods.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]  # without the monitoring component: the trainer and nothing else
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "a namespaceSelector here would let other namespaces in"
    allowed = peer["podSelector"]["matchLabels"]
    rayjob = find(documents(rendered["rayjob"]), "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:
        assert allowed.items() <= template["metadata"]["labels"].items(), "a Ray pod the NetworkPolicy would block"
    assert not allowed.items() <= server_pods.items()
    # with monitoring: one more rule, for Prometheus pods in the monitoring namespace
    with_prometheus = find(documents(rendered["overlays/gpu+monitoring"]), "NetworkPolicy", "setpo-server")
    assert len(with_prometheus["spec"]["ingress"]) == 2
    prometheus = with_prometheus["spec"]["ingress"][1]["from"][0]
    assert prometheus["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


def test_service_monitor_scrapes_the_service_metrics_port(rendered):
    docs = documents(rendered["overlays/cpu+monitoring"])
    monitor, service = find(docs, "ServiceMonitor"), find(docs, "Service", "setpo-server")
    selected = [
        d
        for d in docs
        if d["kind"] == "Service"
        and monitor["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()
    ]
    assert selected == [service], "one Service scraped: through the headless one too, every pod would count twice"
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_headless_service_names_every_ready_server_pod(rendered, overlay):
    """Issue 39.2: one A record per ready pod, which a client given dns:///<name> resolves and spreads a step over
    (kube-proxy's per-connection balance of the ClusterIP Service can put a step's connections on one pod)."""
    docs = documents(rendered[overlay])
    pods = find(docs, "Deployment", "setpo-server")["spec"]["template"]
    headless, service = find(docs, "Service", "setpo-server-pods"), find(docs, "Service", "setpo-server")
    assert headless["spec"]["clusterIP"] == "None" and service["spec"]["type"] == "ClusterIP"
    assert not headless["spec"].get("publishNotReadyAddresses"), "only pods whose /ready answers 200"
    assert headless["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    assert headless["spec"]["ports"] == service["spec"]["ports"]


def test_rayjob_runs_a_recipe_against_the_service_dns_name(rendered):
    service = find(documents(rendered["overlays/gpu"]), "Service", "setpo-server-pods")
    port = service["spec"]["ports"][0]["port"]
    dns = f"dns:///{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:{port}"
    rayjob = find(documents(rendered["rayjob"]), "RayJob")
    assert rayjob["metadata"]["namespace"] == service["metadata"]["namespace"], (
        "the NetworkPolicy's podSelector only matches its own namespace"
    )
    recipe = re.fullmatch(r"bash /opt/setpo/recipes/(\w+)\.sh", rayjob["spec"]["entrypoint"])
    assert recipe and (RECIPES / f"{recipe.group(1)}.sh").exists(), rayjob["spec"]["entrypoint"]
    assert yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]["SETPO_URL"] == dns
    cluster = rayjob["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    head_env = {e["name"]: e for e in head["env"]}
    assert head_env["SETPO_URL"]["value"] == dns
    # the recipe's required inputs (services/trainer/recipes/common.sh) are set where the driver runs
    assert {"MODEL_PATH", "DATA_PATH", "SETPO_URL", "SAVE_PATH", "SETPO_API_KEY"} <= set(head_env)
    assert head_env["SETPO_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "setpo-api-key", "key": "api-key"}
    workers = cluster["workerGroupSpecs"]
    gpus = sum(
        int(g["replicas"]) * int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        for g in workers
    )
    assert gpus == int(head_env["NODES"]["value"]) * int(head_env["GPUS_PER_NODE"]["value"]), (
        "the recipe's NODES x GPUS_PER_NODE must match the worker GPUs"
    )
    assert all(c["image"] == head["image"] for g in workers for c in g["template"]["spec"]["containers"])
    # the ray version OpenRLHF pins and the trainer image installs
    assert cluster["rayVersion"] == "2.55.0"


# --- broken manifests must fail ---------------------------------------------------------------------------


def broken_copy(tmp_path: Path, relative: str, old: str, new: str) -> Path:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    target = copy / relative
    assert old in target.read_text(), f"the test's anchor text {old!r} moved: update the test"
    target.write_text(target.read_text().replace(old, new, 1))
    return copy


@pytest.mark.parametrize(
    "relative, old, new",
    [
        ("base/deployment.yaml", "          readinessProbe:", "          readinessProbes:"),  # a misspelt field
        (
            "base/deployment.yaml",
            "              containerPort: 8000",
            '              containerPort: "8000"',
        ),  # a wrong type
        ("overlays/gpu/deployment-gpu.yaml", "            failureThreshold: 120", "            failureThreshold: many"),
    ],
    ids=["unknown-field", "wrong-type", "overlay-patch"],
)
def test_a_broken_manifest_fails_strict_validation(tmp_path, relative, old, new):
    overlay = "overlays/gpu" if relative.startswith("overlays/gpu") else "overlays/cpu"
    rendered = kustomize(broken_copy(tmp_path, relative, old, new) / overlay)
    assert rendered.returncode == 0, rendered.stderr
    result = kubernetes_validate(rendered.stdout, KUBERNETES_VERSIONS[-1])
    assert result.returncode != 0, f"kubernetes-validate accepted {new.strip()!r}"


@pytest.mark.parametrize(
    "old, new",
    [
        ('num-cpus: "0"', "num-cpus: 0"),  # rayStartParams must be strings
        ("shutdownAfterJobFinishes: true", "shutdownAfterJobFinish: true"),  # not a RayJob field
        ("submissionMode: K8sJobMode", "submissionMode: K8sMode"),
        (
            "              imagePullPolicy: IfNotPresent",
            "              imagePullPolicy: IfNotPresent\n              restartPolicy: Always\n              gpus: 8",
        ),  # not a container field
        (
            "      SETPO_URL: dns:///setpo-server",
            "      SETPO_URL: [dns:///setpo-server",
        ),  # runtimeEnvYAML no longer YAML
    ],
    ids=[
        "non-string-start-param",
        "unknown-spec-field",
        "bad-submission-mode",
        "unknown-container-field",
        "runtime-env-not-yaml",
    ],
)
def test_a_broken_rayjob_fails_our_schema(tmp_path, old, new):
    rendered = kustomize(broken_copy(tmp_path, "rayjob/rayjob.yaml", old, new) / "rayjob")
    assert rendered.returncode == 0, rendered.stderr
    result = validate_crds(rendered.stdout)
    assert result.returncode == 1 and "ERROR" in result.stdout, f"our RayJob schema accepted {new.strip()!r}"


def test_a_custom_resource_without_a_schema_fails(rendered):
    unknown = "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: x\nspec: {}\n"
    result = validate_crds(rendered["rayjob"] + "---\n" + unknown)
    assert result.returncode == 1 and "no schema for RayCluster" in result.stdout


def test_a_broken_kustomization_fails_to_render(tmp_path):
    copy = broken_copy(tmp_path, "base/kustomization.yaml", "  - pdb.yaml", "  - pdbs.yaml")
    assert kustomize(copy / "overlays/cpu").returncode != 0


# --- the Ray cluster is closed --------------------------------------------------------------------------------


def ray_pod_templates(rayjob: dict) -> dict[str, dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = {"head": cluster["headGroupSpec"]["template"], "submitter": rayjob["spec"]["submitterPodTemplate"]}
    templates.update({f"worker {g['groupName']}": g["template"] for g in cluster["workerGroupSpecs"]})
    return templates


def test_only_the_ray_clusters_own_pods_the_submitter_and_the_operator_reach_it(rendered):
    docs = documents(rendered["rayjob"])
    rayjob, policy = find(docs, "RayJob"), find(docs, "NetworkPolicy", "setpo-ray")
    templates = ray_pod_templates(rayjob)
    selected = policy["spec"]["podSelector"]["matchLabels"]
    for name in ("head", *[n for n in templates if n.startswith("worker")]):
        assert selected.items() <= templates[name]["metadata"]["labels"].items(), f"the {name} pods are not covered"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    own, submitter, operator = rules
    # Ray's own pods talk to each other on any port (GCS, object manager, workers' random ports)
    assert own["from"] == [{"podSelector": {"matchLabels": selected}}] and "ports" not in own
    # the submitter and the KubeRay operator (which polls the job) reach the dashboard and nothing else
    for rule in (submitter, operator):
        assert rule["ports"] == [{"port": 8265, "protocol": "TCP"}]
    (peer,) = submitter["from"]
    assert (
        set(peer) == {"podSelector"}
        and peer["podSelector"]["matchLabels"].items() <= templates["submitter"]["metadata"]["labels"].items()
    )
    assert not peer["podSelector"]["matchLabels"].items() <= selected.items()
    (peer,) = operator["from"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}
    # kubectl port-forward to the dashboard enters through the kubelet, which NetworkPolicies do not filter


def test_ray_token_authentication_from_a_secret_and_no_service_account_token(rendered):
    rayjob = find(documents(rendered["rayjob"]), "RayJob")
    for name, template in ray_pod_templates(rayjob).items():
        spec = template["spec"]
        assert spec.get("automountServiceAccountToken") is False, (
            f"{name}: no component of the job talks to the Kubernetes API"
        )
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", name
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ray-auth-token", "key": "token"}, name
    # no secret in the job's runtime env (Ray logs it; `ray list runtime-envs` shows it)
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert not {"SETPO_API_KEY", "WANDB_API_KEY", "RAY_AUTH_TOKEN"} & set(runtime_env.get("env_vars", {}))
    assert "client" not in {
        p["name"]
        for p in rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
