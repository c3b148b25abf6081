"""Validate the custom resources of rendered Kubernetes manifests against our own schemas (deploy/schemas/):
KubeRay's RayJob, the Prometheus Operator's ServiceMonitor and KEDA's ScaledObject, whose CRDs are not available
offline.

    kubectl kustomize deploy/k8s/rayjob | python deploy/validate_crds.py -
    python deploy/validate_crds.py rendered.yaml [more.yaml ...]

Built-in kinds are `kubernetes-validate --strict`'s job and are passed over here. A kind that is neither built in
nor covered by a schema here is an error, so a new custom resource cannot slip through unchecked. Pod templates
inside a RayJob are checked against Kubernetes' own strict schemas, as shipped with kubernetes-validate.
Prints one line per problem; exit status 1 if there is any.
"""

import argparse
import json
import sys
from importlib.resources import files
from pathlib import Path

import kubernetes_validate
import yaml
from jsonschema import Draft202012Validator
from kubernetes_validate.utils import SchemaNotFoundError
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parent / "schemas"
# (apiVersion, kind) -> our schema file
CUSTOM_KINDS = {
    ("ray.io/v1", "RayJob"): "rayjob.schema.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.schema.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.schema.yaml",
}
# The oldest Kubernetes the manifests are meant for; pod templates are checked against its schema.
KUBERNETES_VERSION = "1.30"


def validator_for(schema_file: str, kubernetes_version: str) -> Draft202012Validator:
    """Our schema, with "/api/_definitions.json" resolving to kubernetes-validate's strict definitions."""
    schema = yaml.safe_load((SCHEMAS / schema_file).read_text())
    # Kubernetes' schemas live under https://kubernetes.io/api/; ours get an id there so their relative
    # "/api/_definitions.json" references land on the same definitions document.
    schema["$id"] = f"https://kubernetes.io/setpo/{schema_file}"
    definitions_path = (
        files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{kubernetes_version}.0-local-strict"
        / "_definitions.json"
    )
    definitions = Resource.from_contents(json.loads(definitions_path.read_text()))
    registry = Registry().with_resources(
        [(definitions.id(), definitions), (schema["$id"], Resource.from_contents(schema))]
    )
    return Draft202012Validator(schema, registry=registry)


def runtime_env_problems(document: dict) -> list[str]:
    """RayJob.spec.runtimeEnvYAML is YAML inside a string: the schema sees only a string, so parse it here."""
    text = document.get("spec", {}).get("runtimeEnvYAML")
    if text is None:
        return []
    try:
        runtime_env = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [f"spec.runtimeEnvYAML is not YAML: {exc}"]
    if not isinstance(runtime_env, dict):
        return ["spec.runtimeEnvYAML must be a mapping (Ray's runtime_env), e.g. 'env_vars: {KEY: value}'"]
    env_vars = runtime_env.get("env_vars", {})
    if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
        return ['spec.runtimeEnvYAML.env_vars must map names to strings (quote numbers: "1")']
    return []


def problems_in(documents: list[dict], source: str, kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    validators = {}
    problems = []
    for document in documents:
        if not document:
            continue
        api_version, kind = document.get("apiVersion"), document.get("kind")
        name = f"{source}: {kind}/{document.get('metadata', {}).get('name', '?')}"
        schema_file = CUSTOM_KINDS.get((api_version, kind))
        if schema_file is None:
            try:
                kubernetes_validate.validate(document, kubernetes_version, strict=True)
            except SchemaNotFoundError:
                problems.append(
                    f"{name}: no schema for {kind} ({api_version}): add one to deploy/schemas/ and CUSTOM_KINDS"
                )
            except Exception:
                pass  # a built-in kind: kubernetes-validate --strict reports its errors
            continue
        if schema_file not in validators:
            validators[schema_file] = validator_for(schema_file, kubernetes_version)
        for error in sorted(validators[schema_file].iter_errors(document), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in error.absolute_path) or "(document)"
            problems.append(f"{name}: {where}: {error.message}")
        if kind == "RayJob":
            problems.extend(f"{name}: {p}" for p in runtime_env_problems(document))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="validate_crds", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", help="rendered manifests (YAML, several documents each); - reads stdin")
    parser.add_argument(
        "-k",
        "--kubernetes-version",
        default=KUBERNETES_VERSION,
        help="major.minor whose pod schema applies (default %(default)s)",
    )
    args = parser.parse_args(argv)
    problems = []
    for path in args.files:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            problems.append(f"{path}: not YAML: {exc}")
            continue
        problems.extend(problems_in(documents, "stdin" if path == "-" else path, args.kubernetes_version))
    for problem in problems:
        print(f"ERROR {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
