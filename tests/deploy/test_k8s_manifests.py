"""deploy/k8s validates offline and keeps the promises the issue makes about it.

Every overlay is built with the real ``kustomize`` and every object it renders is checked by
``kubeconform -strict`` (both built by deploy/local/gotools.sh). Built-in kinds are validated
(strict: unknown fields refused) against the Kubernetes JSON schemas shipped inside the
``kubernetes-validate`` wheel; the two CRDs (Strimzi KafkaTopic, KEDA ScaledObject) against
small schemas in tests/deploy/schemas. No network is used.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings

from agentledger import settings
from tests.deploy.conftest import MANIFEST_RESULTS
from tests.deploy.test_compose import NEEDS, SETTINGS

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
SCHEMAS = Path(__file__).with_name("schemas")
# Where deploy/local/gotools.sh (run by the bootstrap) builds kustomize and kubeconform.
LOCAL_BIN = Path(os.environ.get("AGENTLEDGER_LOCAL_DIR", ROOT / ".local")) / "bin"
# The oldest minor the manifests must work on; every field used exists there.
KUBERNETES_VERSION = "1.30.0"
CRD_SCHEMAS = {
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): "kafkatopic-kafka.strimzi.io-v1beta2.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1.json",
}
EXECUTORS = {"crm": "executor-crm", "billing": "executor-billing"}
HTTP_WORKLOADS = {"ingress", "console", "crm-read", "crm-write"}
SERVICE_OF = {  # Deployment -> the service module it runs (for its settings class)
    "ingress": "ingress", "planner": "planner", "admission": "admission", "relay": "relay",
    "executor-crm": "executor", "executor-billing": "executor", "reconciler": "reconciler",
    "crm-read": "crm", "crm-write": "crm", "console": "console", "notifier": "notifier",
}


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(directory: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((directory / "kustomization.yaml").read_text()))


def _resources(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The documents a kustomization lists, following bases recursively."""
    for entry in _kustomization(directory)["resources"]:
        target = (directory / entry).resolve()
        if target.is_dir():
            yield from _resources(target)
        else:
            for doc in _load(target):
                yield target, doc


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return [doc for _, doc in _resources(BASE)]


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments and Jobs by name, with their pod spec."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "Job")}


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"]["spec"])


# ----------------------------------------------------------------------------- schemas
def _validate(doc: dict[str, Any]) -> None:
    crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        schema = json.loads((SCHEMAS / crd).read_text())
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_manifest_validates_against_its_schema(docs: list[dict[str, Any]]) -> None:
    assert len(docs) > 40
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert set(CRD_SCHEMAS) <= kinds
    for doc in docs:
        try:
            _validate(doc)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_crd_schemas_refuse_a_typo(docs: list[dict[str, Any]]) -> None:
    topic = copy.deepcopy(next(d for d in docs if d["kind"] == "KafkaTopic"))
    topic["spec"]["partition"] = topic["spec"].pop("partitions")
    with pytest.raises(jsonschema.ValidationError):
        _validate(topic)
    scaled = copy.deepcopy(next(d for d in docs if d["kind"] == "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"
    with pytest.raises(jsonschema.ValidationError):
        _validate(scaled)


def test_strict_builtin_validation_refuses_a_typo(docs: list[dict[str, Any]]) -> None:
    deployment = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 90
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


# ----------------------------------------------------------------------------- kustomize
def test_kustomization_references_resolve() -> None:
    listed: set[Path] = set()
    for directory in [BASE, *sorted((K8S / "overlays").iterdir())]:
        kustomization = _kustomization(directory)
        for entry in kustomization.get("resources", []):
            target = (directory / entry).resolve()
            assert target.exists(), f"{directory.name}: {entry} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), entry
            else:
                listed.add(target)
        for patch in kustomization.get("patches", []):
            assert (directory / patch["path"]).exists(), patch["path"]
    on_disk = {p.resolve() for p in BASE.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert on_disk == listed, f"not in kustomization.yaml: {sorted(map(str, on_disk - listed))}"


def _matches(doc: dict[str, Any], target: dict[str, str]) -> bool:
    group = doc["apiVersion"].rsplit("/", 1)[0] if "/" in doc["apiVersion"] else ""
    return all([
        target.get("kind", doc["kind"]) == doc["kind"],
        target.get("group", group) == group,
        target.get("name", doc["metadata"]["name"]) == doc["metadata"]["name"],
        target.get("namespace", doc["metadata"].get("namespace")) ==
        doc["metadata"].get("namespace"),
    ])


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    for op in ops:
        assert op["op"] == "replace", "only replace is used; extend this helper for more"
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].lstrip("/").split("/")]
        node = doc
        for part in parents:
            node = node[part]
        assert leaf in node, f"{op['path']} does not exist in {doc['metadata']['name']}"
        node[leaf] = op["value"]


def test_overlays_patch_existing_resources_into_valid_ones(docs: list[dict[str, Any]]) -> None:
    for overlay in sorted((K8S / "overlays").iterdir()):
        rendered = copy.deepcopy(docs)
        for patch in _kustomization(overlay).get("patches", []):
            body = yaml.safe_load((overlay / patch["path"]).read_text())
            if isinstance(body, list):  # JSON 6902 with a target
                hits = [d for d in rendered if _matches(d, patch["target"])]
                assert hits, f"{overlay.name}: {patch['path']} matches nothing"
                for doc in hits:
                    _json_patch(doc, body)
            else:  # strategic merge: names an existing object and container
                meta = body["metadata"]
                hits = [d for d in rendered if d["kind"] == body["kind"] and
                        d["metadata"]["name"] == meta["name"] and
                        d["metadata"].get("namespace") == meta.get("namespace")]
                assert hits, f"{overlay.name}: {patch['path']} names no resource"
                names = {c["name"] for c in _pod(hits[0])["containers"]}
                assert {c["name"] for c in body["spec"]["template"]["spec"]["containers"]} <= names
        for doc in rendered:
            _validate(doc)


# ----------------------------------------------------------------------------- pods
def test_every_workload_has_limits_and_runs_as_non_root(docs: list[dict[str, Any]]) -> None:
    workloads = _workloads(docs)
    assert set(SERVICE_OF) | {"migrate"} == set(workloads)
    for name, workload in workloads.items():
        pod = _pod(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 10001, name  # the image's USER
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert {"cpu", "memory"} <= set(resources["limits"]), name
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"]["drop"] == ["ALL"], name


def test_http_services_have_probes_and_others_do_not_pretend(docs: list[dict[str, Any]]) -> None:
    for name, workload in _workloads(docs).items():
        container = _pod(workload)["containers"][0]
        if name in HTTP_WORKLOADS:
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            ports = {p["name"] for p in container["ports"]}
            assert container["readinessProbe"]["httpGet"]["port"] in ports, name
        else:  # no HTTP server in these processes: an HTTP probe would always fail
            assert "readinessProbe" not in container and "livenessProbe" not in container, name


def _env(workload: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, str]:
    configmaps, secrets = _by_kind(docs, "ConfigMap"), _by_kind(docs, "Secret")
    env: dict[str, str] = {}
    container = _pod(workload)["containers"][0]
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]]["data"])
        if "secretRef" in source:
            env.update(secrets[source["secretRef"]["name"]]["stringData"])
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    return env


def test_each_deployment_environment_satisfies_its_settings(
    docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, module in SERVICE_OF.items():
        env = _env(_workloads(docs)[name], docs)
        cls: type[BaseSettings] = SETTINGS[module]
        prefix = str(cls.model_config.get("env_prefix", ""))
        fields = {f.upper() for f in cls.model_fields}
        for key in env:
            if key.startswith(prefix):
                assert key[len(prefix):] in fields, f"{name}: {key} is no setting"
        with monkeypatch.context() as m:
            for key in list(os.environ):
                if key.startswith("AGENTLEDGER_"):
                    m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            cls.model_validate({})


def test_each_deployment_starts_on_a_named_configuration(docs: list[dict[str, Any]]) -> None:
    # Issue 38: a service refuses to start on the packaged configuration unless the demo
    # profile says so; every Deployment here must be startable.
    for name, module in SERVICE_OF.items():
        if module in NEEDS:
            env = _env(_workloads(docs)[name], docs)
            assert settings.missing_configuration(**NEEDS[module], environ=env) == [], name


def test_each_secret_is_mounted_by_its_own_workload_only(docs: list[dict[str, Any]]) -> None:
    users: dict[str, set[str]] = defaultdict(set)
    for name, workload in _workloads(docs).items():
        pod = _pod(workload)
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    users[source["secretRef"]["name"]].add(name)
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    users[ref["name"]].add(name)
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                users[volume["secret"]["secretName"]].add(name)
    secrets = _by_kind(docs, "Secret")
    assert set(users) == set(secrets), "a Secret nobody mounts, or a mount of a missing one"
    for secret, mounted_by in users.items():
        assert len(mounted_by) == 1, f"{secret} is shared by {sorted(mounted_by)}"
        (owner,) = mounted_by
        assert secret in (owner, f"agentledger-{owner}"), f"{secret} mounted by {owner}"
    # R1.7: write tokens exist only in the executors' Secrets, one connector each.
    for secret, doc in secrets.items():
        data = doc["stringData"]
        if "AGENTLEDGER_EXECUTOR_WRITE_TOKENS" in data:
            connector = secret.removeprefix("agentledger-executor-")
            assert list(json.loads(data["AGENTLEDGER_EXECUTOR_WRITE_TOKENS"])) == [connector]
        else:
            assert not any("WRITE" in k for k in data), secret
    assert "AGENTLEDGER_DATABASE_URL" not in secrets["agentledger-planner"]["stringData"]


# ----------------------------------------------------------------------------- scaling
def test_one_executor_per_connector_scaled_on_its_own_lag(docs: list[dict[str, Any]]) -> None:
    workloads, scaled = _workloads(docs), _by_kind(docs, "ScaledObject")
    topics = {d["spec"]["topicName"]: d for d in docs if d["kind"] == "KafkaTopic"}
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    groups = set()
    for connector, name in EXECUTORS.items():
        pod = _pod(workloads[name])
        assert pod["terminationGracePeriodSeconds"] == 90, name
        env = _env(workloads[name], docs)
        assert env["AGENTLEDGER_EXECUTOR_CONNECTOR"] == connector
        assert float(env["AGENTLEDGER_EXECUTOR_DRAIN_S"]) < pod["terminationGracePeriodSeconds"]
        groups.add(env["AGENTLEDGER_EXECUTOR_GROUP_ID"])
        topic = topics[f"exec.{connector}.v1"]
        assert int(env["AGENTLEDGER_EXECUTOR_PARTITIONS"]) == topic["spec"]["partitions"]
        so = scaled[name]
        assert so["spec"]["scaleTargetRef"]["name"] == name
        (trigger,) = so["spec"]["triggers"]
        assert trigger["metadata"]["consumerGroup"] == env["AGENTLEDGER_EXECUTOR_GROUP_ID"]
        assert trigger["metadata"]["topic"] == f"exec.{connector}.v1"
        # More pods than partitions would idle; fewer would leave partitions to share.
        assert so["spec"]["maxReplicaCount"] == topic["spec"]["partitions"]
        pdb = pdbs[name]
        assert pdb["spec"]["selector"]["matchLabels"] == \
            workloads[name]["spec"]["selector"]["matchLabels"]
    assert len(groups) == len(EXECUTORS)
    relay_env = _env(workloads["relay"], docs)
    assert int(relay_env["AGENTLEDGER_RELAY_EXEC_PARTITIONS"]) == \
        topics["exec.crm.v1"]["spec"]["partitions"]
    assert workloads["relay"]["spec"]["replicas"] == 1
    assert workloads["relay"]["spec"]["strategy"]["type"] == "Recreate"


def test_topics_are_replicated_for_acks_all(docs: list[dict[str, Any]]) -> None:
    topics = [d for d in docs if d["kind"] == "KafkaTopic"]
    names = {t["spec"]["topicName"] for t in topics}
    assert {"exec.crm.v1", "exec.billing.v1", "audit.events.v1", "agent.outcomes.v1",
            "agent.requests.v1", "agent.proposals.v1", "relay.dlq.v1"} <= names
    for t in topics:
        assert t["spec"]["replicas"] == 3, t["spec"]["topicName"]
        assert int(t["spec"]["config"]["min.insync.replicas"]) == 2, t["spec"]["topicName"]
        assert t["metadata"]["annotations"]["agentledger.dev/sizing"], "say why this size"


# ----------------------------------------------------------------------------- network
def _peers(rules: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Peers as (namespace selector, pod selector) label strings."""
    found = set()
    for rule in rules:
        for peer in rule.get("to", rule.get("from", [])):
            ns = ",".join(f"{k}={v}" for k, v in
                          sorted(peer.get("namespaceSelector", {}).get("matchLabels", {}).items()))
            pod = peer.get("podSelector", {})
            labels = ",".join(f"{k}={v}" for k, v in sorted(pod.get("matchLabels", {}).items()))
            for expr in pod.get("matchExpressions", []):
                labels += f"{expr['key']} {expr['operator']} {sorted(expr['values'])}"
            found.add((ns, labels))
    return found


def test_network_policies_draw_the_authority_boundary(docs: list[dict[str, Any]]) -> None:
    policies = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
                for d in docs if d["kind"] == "NetworkPolicy"}
    for namespace in ("agentledger", "agentledger-crm"):
        deny = policies[(namespace, "default-deny")]
        assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}

    def egress(name: str) -> set[tuple[str, str]]:
        return _peers(policies[("agentledger", name)]["egress"])

    write = ("agentledger.dev/system=crm", "agentledger.dev/crm-api=write")
    read = ("agentledger.dev/system=crm", "agentledger.dev/crm-api=read")
    postgres = ("kubernetes.io/metadata.name=agentledger-data", "agentledger.dev/system=postgres")
    kafka = ("kubernetes.io/metadata.name=kafka", "strimzi.io/cluster=agentledger")
    model = ("agentledger.dev/system=model", "agentledger.dev/system=model")
    dns = ("kubernetes.io/metadata.name=kube-system", "k8s-app=kube-dns")
    otel = ("kubernetes.io/metadata.name=observability", "app.kubernetes.io/name=otel-collector")

    holders = {name for (ns, name), spec in policies.items()
               if ns == "agentledger" and write in _peers(spec.get("egress", []))}
    assert holders == {"executors"}
    assert policies[("agentledger", "executors")]["podSelector"] == \
        {"matchLabels": {"agentledger.dev/component": "executor"}}
    assert egress("planner") == {dns, kafka, otel, model, read}
    assert egress("relay") == {dns, kafka, postgres, otel}
    crm_write = policies[("agentledger-crm", "crm-write")]
    assert _peers(crm_write["ingress"]) == {
        ("kubernetes.io/metadata.name=agentledger", "agentledger.dev/component=executor")}
    # Every executor pod carries the label the policies select on.
    for name in EXECUTORS.values():
        labels = _workloads(docs)[name]["spec"]["template"]["metadata"]["labels"]
        assert labels["agentledger.dev/component"] == "executor"


# ----------------------------------------------------------------------------- kubeconform
def _tool(name: str) -> str:
    """A Go tool deploy/local/gotools.sh built (`make test` runs it: bootstrap.sh test): never skipped."""
    built = LOCAL_BIN / name
    found = str(built) if built.is_file() else shutil.which(name)
    assert found, f"{name} is missing: make test installs it (bash deploy/local/bootstrap.sh test)"
    return found


def _reachable(schema: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    """The ``$defs`` entries ``schema`` refers to, transitively (refs already rewritten)."""
    needed: dict[str, Any] = {}
    todo = [schema]
    while todo:
        text = json.dumps(todo.pop())
        for name in re.findall(r'"#/\$defs/([^"]+)"', text):
            if name not in needed:
                needed[name] = definitions[name]
                todo.append(definitions[name])
    return needed


@pytest.fixture(scope="session")
def schema_locations(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """kubeconform ``-schema-location`` templates that never leave this machine.

    kubernetes-validate ships each kind's strict schema with ``$ref``s into one shared
    ``/api/_definitions.json``; kubeconform wants one self-contained file per kind (its
    "standalone" layout), so each kind is written with the definitions it reaches. The CRDs
    (Strimzi KafkaTopic, KEDA ScaledObject) use the schemas in tests/deploy/schemas.
    """
    source = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" /
              f"v{KUBERNETES_VERSION}-local-strict")
    definitions = json.loads((source / "_definitions.json").read_text())["$defs"]
    root = tmp_path_factory.mktemp("kubeconform-schemas")
    target = root / f"v{KUBERNETES_VERSION}-standalone-strict"
    target.mkdir()
    for path in source.glob("*.json"):
        if path.name.startswith("_") or path.name == "all.json":
            continue
        schema = json.loads(path.read_text().replace("/api/_definitions.json#/$defs/",
                                                     "#/$defs/"))
        if "kind" not in schema.get("properties", {}):
            continue  # a sub-object (PodSpec...), never a document of its own
        schema["$defs"] = _reachable(schema, definitions)
        (target / path.name).write_text(json.dumps(schema))
    return [
        f"{root}/{{{{ .NormalizedKubernetesVersion }}}}-standalone{{{{ .StrictSuffix }}}}/"
        "{{ .ResourceKind }}{{ .KindSuffix }}.json",
        f"{SCHEMAS}/{{{{ .ResourceKind }}}}-{{{{ .Group }}}}-{{{{ .ResourceAPIVersion }}}}.json",
    ]


def _kubeconform(manifests: str, locations: list[str]) -> subprocess.CompletedProcess[str]:
    """kubeconform -strict over ``manifests``: unknown fields and duplicate keys refused,
    a kind without a schema an error (no -ignore-missing-schemas), nothing fetched."""
    argv = [_tool("kubeconform"), "-strict", "-summary", "-output", "text",
            "-kubernetes-version", KUBERNETES_VERSION]
    for location in locations:
        argv += ["-schema-location", location]
    return subprocess.run([*argv, "-"], input=manifests, capture_output=True, text=True,
                          timeout=120, check=False)


def _build(directory: Path) -> str:
    out = subprocess.run([_tool("kustomize"), "build", str(directory)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("directory", [
    "base", *(f"overlays/{p.name}" for p in sorted((K8S / "overlays").iterdir()))])
def test_kustomize_build_renders_manifests_kubeconform_accepts(
    directory: str, schema_locations: list[str]
) -> None:
    """Every overlay builds with the real kustomize and every object passes kubeconform."""
    built = _build(K8S / directory)
    rendered = [d for d in yaml.safe_load_all(built) if d]
    assert len(rendered) == len([doc for _, doc in _resources(BASE)])
    checked = _kubeconform(built, schema_locations)
    lines = checked.stdout.strip().splitlines()
    kinds = sorted({d["kind"] for d in rendered})
    MANIFEST_RESULTS.append(f"kustomize build deploy/k8s/{directory}: {len(rendered)} objects (" +
                            ", ".join(f"{k} {sum(d['kind'] == k for d in rendered)}"
                                      for k in kinds) + ")")
    MANIFEST_RESULTS.extend(f"  kubeconform {line}" for line in lines[-1:])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert lines[-1].endswith(
        f"{len(rendered)} resources found parsing stdin - Valid: {len(rendered)}, "
        "Invalid: 0, Errors: 0, Skipped: 0"), lines[-1]
    for doc in rendered:  # the same objects, through kubernetes-validate as well
        _validate(doc)


def test_kubeconform_refuses_a_typo_in_a_builtin_kind_and_a_crd(
    schema_locations: list[str]
) -> None:
    rendered = [d for d in yaml.safe_load_all(_build(BASE)) if d]
    deployment = copy.deepcopy(next(d for d in rendered if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 90
    scaled = copy.deepcopy(next(d for d in rendered if d["kind"] == "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"
    for broken in (deployment, scaled):
        checked = _kubeconform(yaml.safe_dump(broken), schema_locations)
        assert checked.returncode != 0, checked.stdout
        assert "Invalid: 1" in checked.stdout, checked.stdout
