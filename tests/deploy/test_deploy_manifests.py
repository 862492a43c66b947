"""docker-compose.yml and deploy/k8s: valid against their published schemas, and consistent
with the code (modules, flags, settings, routes, replica rules). Offline: no Docker, no cluster.

Compose: the official Compose specification schema (vendored in deploy/schemas/). Kubernetes:
the schemas kubernetes-validate ships, in strict mode (unknown fields fail). Each overlay is
rendered (the kustomize subset in :func:`checks.render`) and checked as a whole. The negative
tests mutate manifests in memory and show that every kind of check rejects a broken one.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy import checks

K8S_VERSION = "1.33"

MANIFESTS = [(p, i, d) for p in checks.manifest_files() for i, d in enumerate(checks.load_docs(p))]


def _id(path: Path, index: int, doc: dict[str, Any]) -> str:
    return f"{path.relative_to(checks.K8S_DIR)}#{index}:{doc['kind']}/{doc['metadata']['name']}"


def _strict_errors(doc: dict[str, Any]) -> str | None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
    return None


# --- docker-compose.yml -----------------------------------------------------------------------

def test_vendored_compose_schema_names_its_source() -> None:
    readme = (checks.COMPOSE_SCHEMA.parent / "README.md").read_text()
    assert "github.com/compose-spec/compose-spec" in readme and "Apache" in readme


def test_compose_file_follows_the_compose_specification() -> None:
    assert checks.compose_schema_errors(checks.load_compose()) == []


def test_compose_services_are_consistent_with_the_code() -> None:
    assert checks.compose_problems(checks.load_compose()) == []


def test_compose_runs_every_service_with_a_standby_scheduler() -> None:
    services = checks.load_compose()["services"]
    modules = {s["command"][2]: checks.replicas(s) for s in services.values()
               if s.get("command", [""])[0] == "python"}
    assert modules["services.scheduler"] == 2
    assert 1 <= modules["services.projector"] <= int(
        services["projector"]["environment"]["HS_KAFKA_PARTITIONS"])
    assert {"services.stack", "services.ingest", "services.completions"} <= set(modules)
    assert services["scheduler"]["environment"]["HS_SCHEDULER_DRIVER"] == "local"


def test_dockerfile_builds_the_project_as_a_non_root_user() -> None:
    import tomllib

    lines = [ln.split() for ln in (checks.REPO / "Dockerfile").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    instructions = [(words[0], words[1:]) for words in lines if words[0].isupper()]
    stages = [args for op, args in instructions if op == "FROM"]
    assert {args[0] for args in stages} == {"python:3.11-slim"}
    assert stages[-1] == ["python:3.11-slim"]  # the image itself: no compiler in it
    # The worker's process spawner, compiled in a stage of its own, beside the image's Python
    # (where services.worker.spawner.helper_path looks).
    assert ("COPY", ["--from=spawner", "/tmp/hs-spawner", "/usr/local/bin/hs-spawner"]) in (
        instructions)
    user = [args for op, args in instructions if op == "USER"][-1][0]
    uid = int(user.split(":")[0])
    assert uid != 0
    copied = {args[0] for op, args in instructions if op == "COPY"}
    pyproject = tomllib.loads((checks.REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"][
        "include"]}
    assert packages <= copied
    run_as = {d["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
              for d in checks.render(checks.K8S_DIR / "gcp") if checks.pod_spec(d) is not None}
    assert run_as == {uid}


# --- deploy/k8s -------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "index", "doc"), MANIFESTS,
                         ids=[_id(*m) for m in MANIFESTS])
def test_manifest_is_valid_kubernetes_in_strict_mode(path: Path, index: int,
                                                     doc: dict[str, Any]) -> None:
    assert _strict_errors(doc) is None


@pytest.mark.parametrize("overlay", checks.OVERLAYS)
def test_rendered_overlay_is_valid_and_consistent(overlay: str) -> None:
    docs = checks.render(checks.K8S_DIR / overlay)
    assert {(d["kind"], _strict_errors(d)) for d in docs} == {(d["kind"], None) for d in docs}
    assert checks.k8s_problems(docs) == []


@pytest.mark.parametrize("overlay", checks.OVERLAYS)
def test_overlay_runs_workers_as_vms(overlay: str) -> None:
    docs = checks.render(checks.K8S_DIR / overlay)
    cloud = next(d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"] == "hailstream-cloud")
    assert cloud["data"]["HS_SCHEDULER_DRIVER"] == overlay
    scheduler = next(d for d in docs if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "scheduler")
    assert scheduler["spec"]["replicas"] == 2
    assert scheduler["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    sa = next(d for d in docs if d["kind"] == "ServiceAccount"
              and d["metadata"]["name"] == "hailstream-scheduler")
    if overlay == "gcp":  # GKE Workload Identity
        assert "iam.gke.io/gcp-service-account" in sa["metadata"]["annotations"]
        assert cloud["data"]["HS_STORAGE_URL"].startswith("gs://")
    else:  # the driver asks IMDS for the node pool's user-assigned identity
        assert cloud["data"]["HS_AZURE_CLIENT_ID"]
        assert scheduler["spec"]["template"]["spec"]["nodeSelector"]


def test_no_worker_workload_in_kubernetes() -> None:
    """Workers are VMs the scheduler creates, never pods."""
    docs = checks.render(checks.K8S_DIR / "gcp")
    assert not [c for c in checks.iter_containers(docs) if c["command"][2] == "services.worker"]


# --- the code the manifests rely on -----------------------------------------------------------

def _commands() -> list[list[str]]:
    found = [s["command"] for s in checks.load_compose()["services"].values()
             if s.get("command", [""])[0] == "python"]
    found += [c["command"] for c in checks.iter_containers(checks.render(checks.K8S_DIR / "gcp"))]
    unique = {tuple(c): c for c in found if any(a.startswith("--") for a in c)}
    return list(unique.values())


def _flag_cases() -> list[Any]:
    return [pytest.param(command, flag, id=f"{command[2]} {flag}")
            for command in _commands() for flag in (a for a in command if a.startswith("--"))]


@pytest.mark.parametrize(("command", "flag"), _flag_cases())
def test_command_flags_exist(command: list[str], flag: str) -> None:
    """Every flag a manifest passes is one the module's --help lists."""
    words = [a for a in command[3:] if not a.startswith("-")][:1] if command[2] == \
        "services.stack" else []
    out = subprocess.run([sys.executable, "-m", command[2], *words, "--help"],
                         capture_output=True, text=True, timeout=120, cwd=checks.REPO,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert flag in out.stdout


def test_setup_targets_the_configured_broker(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """The setup Job and compose's setup run `services.stack setup` against kafka:9092."""
    from typer.testing import CliRunner

    from services.stack import broker, cli, lifecycle

    seen: list[str] = []

    async def wait_for_broker(log: Any, **_: Any) -> None:
        seen.append(log.bootstrap_servers)
        raise lifecycle.StackError("stop here")

    monkeypatch.setattr(broker, "wait_for_broker", wait_for_broker)
    env = {"HS_KAFKA_BOOTSTRAP": "kafka.example:9092", "HS_DATA_DIR": str(tmp_path)}
    CliRunner().invoke(cli.app, ["setup"], env=env)
    assert seen == ["kafka.example:9092"]


# --- the checks can fail ----------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _deployment(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def _container(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return _deployment(docs, name)["spec"]["template"]["spec"]["containers"][0]


SCHEMA_MUTATIONS: dict[str, Mutation] = {
    "unknown container field": lambda d: d.update(imagePullPolicyy="Always"),
    "wrong type": lambda d: d["resources"]["requests"].update(cpu=["500m"]),
    "probe without handler port": lambda d: d["readinessProbe"]["httpGet"].pop("port"),
}


@pytest.mark.parametrize("mutation", SCHEMA_MUTATIONS.values(), ids=SCHEMA_MUTATIONS.keys())
def test_strict_schema_rejects(mutation: Mutation) -> None:
    deployment = copy.deepcopy(_deployment(checks.render(checks.K8S_DIR / "gcp"), "ingest"))
    mutation(deployment["spec"]["template"]["spec"]["containers"][0])
    assert _strict_errors(deployment) is not None


def test_strict_schema_rejects_unknown_top_level_spec_field() -> None:
    deployment = copy.deepcopy(_deployment(checks.render(checks.K8S_DIR / "gcp"), "scheduler"))
    deployment["spec"]["replica"] = 2
    assert _strict_errors(deployment) is not None


K8S_MUTATIONS: dict[str, Callable[[list[dict[str, Any]]], None]] = {
    "selector mismatch": lambda docs: _deployment(docs, "ingest")["spec"]["selector"][
        "matchLabels"].update({"app.kubernetes.io/name": "ingestt"}),
    "service selects nothing": lambda docs: next(
        d for d in docs if d["kind"] == "Service")["spec"]["selector"].update(tier="x"),
    "three schedulers": lambda docs: _deployment(docs, "scheduler")["spec"].update(replicas=3),
    "projector over partitions": lambda docs: _deployment(docs, "projector")["spec"].update(
        replicas=64),
    "missing module": lambda docs: _container(docs, "completions").update(
        command=["python", "-m", "services.completion"]),
    "setting typo": lambda docs: _container(docs, "projector")["env"].append(
        {"name": "HS_KAFKA_PARTITION", "value": "4"}),
    "probe route": lambda docs: _container(docs, "ingest")["livenessProbe"]["httpGet"].update(
        path="/health"),
    "probe port": lambda docs: _container(docs, "scheduler")["readinessProbe"][
        "httpGet"].update(port=9999),
    "no limits": lambda docs: _container(docs, "ingest")["resources"].pop("limits"),
    "root": lambda docs: _container(docs, "ingest")["securityContext"].update(
        allowPrivilegeEscalation=True),
    "missing configmap": lambda docs: docs.remove(next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hailstream")),
    "foreign image": lambda docs: _container(docs, "ingest").update(image="python:3.11"),
}


@pytest.mark.parametrize("mutation", K8S_MUTATIONS.values(), ids=K8S_MUTATIONS.keys())
def test_k8s_checks_reject(mutation: Callable[[list[dict[str, Any]]], None]) -> None:
    docs = checks.render(checks.K8S_DIR / "gcp")
    mutation(docs)
    assert checks.k8s_problems(docs) != []


COMPOSE_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown service key": lambda c: c["services"]["ingest"].update(helthcheck={}),
    "wrong type": lambda c: c["services"]["scheduler"]["deploy"].update(replicas=[2]),
    "bad condition": lambda c: c["services"]["ingest"]["depends_on"]["setup"].update(
        condition="service_done"),
}


@pytest.mark.parametrize("mutation", COMPOSE_MUTATIONS.values(), ids=COMPOSE_MUTATIONS.keys())
def test_compose_schema_rejects(mutation: Callable[[dict[str, Any]], None]) -> None:
    compose = checks.load_compose()
    mutation(compose)
    assert checks.compose_schema_errors(compose) != []


COMPOSE_SEMANTIC_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown dependency": lambda c: c["services"]["ingest"]["depends_on"].update(
        {"kafkaa": {"condition": "service_healthy"}}),
    "one scheduler": lambda c: c["services"]["scheduler"]["deploy"].update(replicas=1),
    "projector over partitions": lambda c: c["services"]["projector"]["deploy"].update(
        replicas=17),
    "setting typo": lambda c: c["services"]["completions"]["environment"].update(
        HS_COMPLETIONS_POLL="1"),
    "missing module": lambda c: c["services"]["completions"].update(
        command=["python", "-m", "services.completion"]),
    "healthcheck route": lambda c: c["services"]["ingest"]["healthcheck"].update(
        test=["CMD", "curl", "http://127.0.0.1:18400/health"]),
    "undeclared volume": lambda c: c["volumes"].pop("hs-shared"),
    "healthy without healthcheck": lambda c: c["services"]["setup"]["depends_on"].update(
        {"completions": {"condition": "service_healthy"}}) or c["services"]["completions"].pop(
        "healthcheck"),
}


@pytest.mark.parametrize("mutation", COMPOSE_SEMANTIC_MUTATIONS.values(),
                         ids=COMPOSE_SEMANTIC_MUTATIONS.keys())
def test_compose_checks_reject(mutation: Callable[[dict[str, Any]], None]) -> None:
    compose = checks.load_compose()
    mutation(compose)
    assert checks.compose_problems(compose) != []
