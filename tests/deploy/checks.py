"""What the deployment tests check, as functions that return problems (empty: fine).

Kept apart from the tests so the negative tests can feed them mutated manifests and show that
each check can fail. Everything here reads files of this repository; nothing needs a network,
Docker or a cluster.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_SCHEMA = REPO / "deploy" / "schemas" / "compose-spec.json"
K8S_DIR = REPO / "deploy" / "k8s"
OVERLAYS = ("gcp", "azure")
CODE_DIRS = ("services", "core", "schemas", "sql")
PROJECT_IMAGE = "hailstream"
NAMESPACE = "hailstream"

Doc = dict[str, Any]

# --- the code: what it reads and serves -------------------------------------------------------

def _code_files() -> Iterator[Path]:
    for d in CODE_DIRS:
        yield from sorted((REPO / d).rglob("*.py"))


@functools.cache
def known_settings() -> frozenset[str]:
    """Every ``HS_*`` name that appears as a whole string literal in the code.

    Settings tables (``{"HS_DB_HOST": ...}``) and ``env.get("HS_X")`` both spell the name as a
    literal; a docstring that merely mentions a name is one longer string and does not count.
    """
    names: set[str] = set()
    pattern = re.compile(r"^HS_[A-Z0-9_]+$")
    for path in _code_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and pattern.match(node.value):
                names.add(node.value)
    return frozenset(names)


def module_file(module: str) -> Path | None:
    """The file ``python -m module`` runs, if it is in this repository."""
    base = REPO.joinpath(*module.split("."))
    for candidate in (base / "__main__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def ingest_routes() -> frozenset[str]:
    """The GET paths of the ingest app without path parameters."""
    text = "".join(p.read_text() for p in sorted((REPO / "services" / "ingest").rglob("*.py")))
    found = re.findall(r"""(?:web\.get|add_get)\(\s*["'](/[^"'{]*)["']""", text)
    return frozenset(found)


@functools.cache
def metrics_server_routes() -> frozenset[str]:
    """The GET paths of the metrics server (services/common/metrics.py)."""
    text = (REPO / "services" / "common" / "metrics.py").read_text()
    return frozenset(re.findall(r"""add_get\(\s*["'](/[^"']*)["']""", text))


def serves_metrics(service: str) -> bool:
    """Whether ``services/<service>`` starts its metrics server (``/metrics``, ``/healthz``)."""
    pattern = re.compile(r"(?:metrics_port|serve_metrics)\(\s*[\"']" + re.escape(service) + "[\"']")
    pkg = REPO / "services" / service
    return pkg.is_dir() and any(pattern.search(p.read_text()) for p in pkg.rglob("*.py"))


def check_command(command: list[str] | None) -> list[str]:
    """``python -m <module> ...`` of a module in this repository."""
    if not command or command[:2] != ["python", "-m"] or len(command) < 3:
        return [f"command {command!r} is not `python -m <module> ...`"]
    if module_file(command[2]) is None:
        return [f"module {command[2]} of {command!r} is not in the repository"]
    return []


def check_settings(names: Iterable[str], where: str) -> list[str]:
    """Every ``HS_*`` name is one the code reads."""
    known = known_settings()
    return [f"{where}: {n} is not read by the code (a typo?)"
            for n in sorted(set(names)) if n.startswith("HS_") and n not in known]


def service_of(command: list[str]) -> str | None:
    """``services.ingest`` -> ``ingest``."""
    parts = command[2].split(".") if len(command) > 2 else []
    return parts[1] if len(parts) > 1 and parts[0] == "services" else None


def flag_value(command: list[str], flag: str) -> str | None:
    for i, arg in enumerate(command[:-1]):
        if arg == flag:
            return command[i + 1]
    return None


# --- docker-compose.yml -----------------------------------------------------------------------

def load_compose() -> Doc:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@functools.cache
def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def compose_schema_errors(compose: Doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in compose_validator().iter_errors(compose)]


def _is_project_service(svc: Doc) -> bool:
    return "build" in svc or str(svc.get("image", "")).split(":")[0] == PROJECT_IMAGE


def _env(svc: Doc) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: str(v) for k, v in env.items()}


def replicas(svc: Doc) -> int:
    return int((svc.get("deploy") or {}).get("replicas", svc.get("scale", 1)))


def compose_problems(compose: Doc) -> list[str]:
    """Semantic checks the schema cannot make."""
    problems: list[str] = []
    services: dict[str, Doc] = compose.get("services", {})
    volumes = set(compose.get("volumes") or {})
    by_module: dict[str, list[str]] = {}
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        for dep, cond in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            if dep not in services:
                problems.append(f"{name}: depends_on unknown service {dep!r}")
                continue
            condition = (cond or {}).get("condition")
            if condition == "service_healthy" and "healthcheck" not in services[dep]:
                problems.append(f"{name}: waits for {dep} to be healthy, but it has no healthcheck")
            if condition == "service_completed_successfully" \
                    and services[dep].get("restart", "no") != "no":
                problems.append(f"{name}: waits for {dep} to complete, but it restarts")
        for vol in svc.get("volumes") or []:
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if source and not source.startswith((".", "/", "~")) and source not in volumes:
                problems.append(f"{name}: volume {source!r} is not declared")
        if not _is_project_service(svc):
            continue
        command = svc.get("command")
        problems += [f"{name}: {p}" for p in check_command(command)]
        problems += check_settings(_env(svc), f"service {name}")
        if command and not check_command(command):
            by_module.setdefault(command[2], []).append(name)
        if command and svc.get("restart", "no") != "no" and "healthcheck" not in svc:
            problems.append(f"{name}: a long-running service without a healthcheck")
        problems += _compose_healthcheck_problems(name, svc)
    counts = {m: sum(replicas(services[n]) for n in names) for m, names in by_module.items()}
    partitions = [int(_env(s).get("HS_KAFKA_PARTITIONS", "8")) for s in services.values()
                  if _is_project_service(s)]
    for module, want in (("services.ingest", None), ("services.projector", None),
                         ("services.scheduler", 2), ("services.completions", None)):
        got = counts.get(module, 0)
        if got < 1:
            problems.append(f"no service runs {module}")
        elif want is not None and got != want:
            problems.append(f"{module} runs {got} replicas, want {want} (active + standby)")
    projectors = counts.get("services.projector", 0)
    if partitions and projectors > min(partitions):
        problems.append(f"{projectors} projector replicas exceed {min(partitions)} partitions")
    return problems


def _compose_healthcheck_problems(name: str, svc: Doc) -> list[str]:
    test = (svc.get("healthcheck") or {}).get("test")
    if not test:
        return []
    text = " ".join(test) if isinstance(test, list) else test
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/[^'\" ]*)", text)
    if not match:
        return [f"{name}: healthcheck {text!r} is not an HTTP check on 127.0.0.1"]
    port, path = int(match.group(1)), match.group(2)
    return _probe_problems(name, svc["command"], _env(svc), port, path)


def _probe_problems(name: str, command: list[str], env: Mapping[str, str], port: int,
                    path: str) -> list[str]:
    """An HTTP check of ``port``/``path`` reaches a route the service's code serves there."""
    service = service_of(command)
    api_port = flag_value(command, "--port") or env.get("HS_INGEST_PORT")
    if service == "ingest" and api_port is not None and port == int(api_port):
        if path not in ingest_routes():
            return [f"{name}: probe path {path} is not an ingest route"]
        return []
    if env.get("HS_METRICS_PORT") is not None and port == int(env["HS_METRICS_PORT"]):
        problems = []
        if path not in metrics_server_routes():
            problems.append(f"{name}: probe path {path} is not a metrics server route")
        if service is None or not serves_metrics(service):
            problems.append(f"{name}: {service} starts no metrics server")
        return problems
    return [f"{name}: probe port {port} is neither the API port nor HS_METRICS_PORT"]


# --- deploy/k8s -------------------------------------------------------------------------------

def manifest_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")


def load_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _json_patch(doc: Doc, ops: list[Doc]) -> None:
    """The ``add``/``replace``/``remove`` operations of RFC 6902 (what the overlays use)."""
    for op in ops:
        *parents, last = [_unescape(t) for t in op["path"].lstrip("/").split("/")]
        node: Any = doc
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        if op["op"] in ("add", "replace"):
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise ValueError(f"unsupported patch op {op['op']!r}")


_KUSTOMIZE_FIELDS = {"apiVersion", "kind", "resources", "patches", "images"}


def render(directory: Path) -> list[Doc]:
    """What ``kustomize build`` makes of the subset of kustomize these manifests use.

    Fails on any other kustomization field, so a manifest cannot rely on something this
    renderer (and so the tests) silently ignores.
    """
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - _KUSTOMIZE_FIELDS
    if unknown:
        raise ValueError(f"{directory}: kustomization fields {sorted(unknown)} are not rendered")
    docs: list[Doc] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        docs += render(path) if path.is_dir() else copy.deepcopy(load_docs(path))
    for patch in kustomization.get("patches", []):
        target = patch["target"]
        matched = [d for d in docs if d["kind"] == target["kind"]
                   and d["metadata"]["name"] == target["name"]]
        if len(matched) != 1:
            raise ValueError(f"{directory}: patch target {target} matches {len(matched)} objects")
        _json_patch(matched[0], yaml.safe_load(patch["patch"]))
    for image in kustomization.get("images", []):
        for container in iter_containers(docs):
            repo, _, tag = container["image"].partition(":")
            if repo == image["name"]:
                container["image"] = f"{image.get('newName', repo)}:{image.get('newTag', tag)}"
    return docs


def pod_spec(doc: Doc) -> Doc | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def iter_containers(docs: Iterable[Doc]) -> Iterator[Doc]:
    for doc in docs:
        spec = pod_spec(doc)
        if spec is not None:
            yield from spec.get("initContainers", [])
            yield from spec["containers"]


def _find(docs: list[Doc], kind: str, name: str) -> Doc | None:
    return next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), None)


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def k8s_problems(docs: list[Doc]) -> list[str]:
    """Semantic checks of one rendered deployment (an overlay)."""
    problems: list[str] = []
    workloads = [d for d in docs if pod_spec(d) is not None]
    if _find(docs, "Namespace", NAMESPACE) is None:
        problems.append(f"no Namespace {NAMESPACE}")
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        if doc["kind"] != "Namespace" and ns != NAMESPACE:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: namespace {ns!r}")
    for w in workloads:
        problems += _workload_problems(docs, w)
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("Service", "PodDisruptionBudget"):
            sel = doc["spec"]["selector"]
            sel = sel.get("matchLabels", {}) if kind == "PodDisruptionBudget" else sel
            if not sel or not any(_matches(sel, w["spec"]["template"]["metadata"]["labels"])
                                  for w in workloads):
                problems.append(f"{kind}/{name}: selector {sel} matches no pod template")
        if kind == "Service":
            problems += _service_port_problems(doc, workloads)
        if kind == "HorizontalPodAutoscaler":
            ref = doc["spec"]["scaleTargetRef"]
            if _find(docs, ref["kind"], ref["name"]) is None:
                problems.append(f"HPA/{name}: scales missing {ref['kind']}/{ref['name']}")
    problems += _replica_problems(docs, workloads)
    return problems


def _container_env(docs: list[Doc], container: Doc) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source:
                ref = _find(docs, kind, source[key]["name"])
                if ref is not None:
                    env.update({k: str(v) for k, v in (ref.get("data") or {}).items()})
                    env.update({k: str(v) for k, v in (ref.get("stringData") or {}).items()})
    env.update({e["name"]: str(e.get("value", "")) for e in container.get("env", [])})
    return env


def _workload_problems(docs: list[Doc], w: Doc) -> list[str]:
    kind, name = w["kind"], w["metadata"]["name"]
    where = f"{kind}/{name}"
    problems: list[str] = []
    spec = pod_spec(w)
    assert spec is not None
    labels = w["spec"]["template"]["metadata"].get("labels", {})
    selector = (w["spec"].get("selector") or {}).get("matchLabels")
    if kind != "Job" and (not selector or not _matches(selector, labels)):
        problems.append(f"{where}: selector {selector} does not match pod labels {labels}")
    sa = spec.get("serviceAccountName")
    if sa and _find(docs, "ServiceAccount", sa) is None:
        problems.append(f"{where}: ServiceAccount {sa} does not exist")
    pod_sc = spec.get("securityContext", {})
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        cw = f"{where} container {c['name']}"
        if c["image"].split(":")[0].rsplit("/", 1)[-1] != PROJECT_IMAGE:
            problems.append(f"{cw}: image {c['image']} is not the project's")
        problems += [f"{cw}: {p}" for p in check_command(c.get("command"))]
        for part in ("requests", "limits"):
            for res in ("cpu", "memory"):
                if res not in c.get("resources", {}).get(part, {}):
                    problems.append(f"{cw}: no {part}.{res}")
        sc = c.get("securityContext", {})
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            problems.append(f"{cw}: runAsNonRoot is not set")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{cw}: allowPrivilegeEscalation is not false")
        for source in c.get("envFrom", []):
            for kind_, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in source and _find(docs, kind_, source[key]["name"]) is None:
                    problems.append(f"{cw}: {kind_} {source[key]['name']} does not exist")
        env = _container_env(docs, c)
        problems += check_settings(env, cw)
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            http = c.get(probe, {}).get("httpGet")
            if http is None:
                continue
            port = ports.get(http["port"], http["port"])
            if not isinstance(port, int) or port not in ports.values():
                problems.append(f"{cw}: {probe} port {http['port']} is not a container port")
                continue
            problems += _probe_problems(f"{cw} {probe}", c["command"], env, port, http["path"])
        if service_of(c.get("command") or []) in ("ingest", "projector", "scheduler",
                                                 "completions") \
                and "livenessProbe" not in c:
            problems.append(f"{cw}: no livenessProbe")
    return problems


def _service_port_problems(svc: Doc, workloads: list[Doc]) -> list[str]:
    problems = []
    pods = [w for w in workloads
            if _matches(svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
    names = {p.get("name") for w in pods for c in pod_spec(w)["containers"]  # type: ignore[index]
             for p in c.get("ports", [])}
    numbers = {p["containerPort"] for w in pods for c in pod_spec(w)["containers"]  # type: ignore[index]
               for p in c.get("ports", [])}
    for port in svc["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        if target not in names and target not in numbers:
            problems.append(f"Service/{svc['metadata']['name']}: targetPort {target} "
                            f"is no port of its pods")
    return problems


def _replica_problems(docs: list[Doc], workloads: list[Doc]) -> list[str]:
    problems = []
    by_module: dict[str, list[Doc]] = {}
    for w in workloads:
        for c in pod_spec(w)["containers"]:  # type: ignore[index]
            if not check_command(c.get("command")):
                by_module.setdefault(c["command"][2], []).append(w)
    partitions = [int(v) for d in docs if d["kind"] == "ConfigMap"
                  for k, v in (d.get("data") or {}).items() if k == "HS_KAFKA_PARTITIONS"]
    for module in ("services.stack", "services.ingest", "services.projector",
                   "services.scheduler", "services.completions"):
        if module not in by_module:
            problems.append(f"no workload runs {module}")
    schedulers = by_module.get("services.scheduler", [])
    if schedulers and (sum(w["spec"].get("replicas", 1) for w in schedulers) != 2):
        problems.append("the scheduler must run 2 replicas (active + hot standby)")
    if not partitions:
        problems.append("no ConfigMap sets HS_KAFKA_PARTITIONS")
    for w in by_module.get("services.projector", []):
        most = max([w["spec"].get("replicas", 1)]
                   + [h["spec"]["maxReplicas"] for h in docs
                      if h["kind"] == "HorizontalPodAutoscaler"
                      and h["spec"]["scaleTargetRef"]["name"] == w["metadata"]["name"]])
        if partitions and most > min(partitions):
            problems.append(f"projector replicas {most} exceed {min(partitions)} partitions")
    return problems
