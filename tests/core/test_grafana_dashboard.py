"""The Grafana dashboard and docs/metrics.md only name metrics the services export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from services.common.metrics import REGISTRY, exported_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "hailstream.json"
DOCS = REPO / "docs" / "metrics.md"
# A metric name in PromQL: an identifier not followed by "(" (a function) and not inside a
# label matcher's quotes or a by/without clause (handled by stripping those first).
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NOT_METRICS = {"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "by",
                "without", "on", "ignoring", "group_left", "group_right", "histogram_quantile",
                "and", "or", "unless", "offset", "bool", "topk", "bottomk", "abs", "clamp_min",
                "clamp_max", "time", "vector", "scalar", "le", "inf", "nan"}


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in panels:
        out.append(p)
        out += _panels(p.get("panels", []))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values and strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors ($__rate_interval, 5m)
    names = set()
    for m in _IDENT.finditer(expr):
        rest = expr[m.end():].lstrip()
        if m.group() in _NOT_METRICS or rest.startswith("("):
            continue
        if m.start() > 0 and expr[m.start() - 1] in "$0123456789.":
            continue
        names.add(m.group())
    return names


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(_dashboard()["panels"])
            for t in p.get("targets", [])]


def test_the_expression_parser_finds_metric_names() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, route) (rate(hs_a_bucket{route="/x"}'
            '[$__rate_interval]))) / on (instance) hs_b * 1000')
    assert metric_names(expr) == {"hs_a_bucket", "hs_b"}


def test_dashboard_is_grafana_json_with_a_prometheus_datasource_variable() -> None:
    dash = _dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert var["query"] == "prometheus"
    ids = [p["id"] for p in _panels(dash["panels"])]
    assert len(ids) == len(set(ids))
    for p in _panels(dash["panels"]):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${" + var["name"] + "}", p["title"]
            assert p["targets"], p["title"]


@pytest.mark.parametrize(("title", "expr"), _exprs(), ids=[f"{t}:{e[:40]}" for t, e in _exprs()])
def test_every_panel_expression_uses_only_exported_metrics(title: str, expr: str) -> None:
    exported = exported_names()
    names = metric_names(expr)
    assert names, f"{title}: no metric in {expr!r}"
    assert names <= exported, f"{title}: {sorted(names - exported)} are not exported"


def test_the_dashboard_covers_the_operational_questions() -> None:
    used = set().union(*(metric_names(e) for _, e in _exprs()))
    for name in ("hs_scheduler_sj_published_total", "hs_worker_mjs_published_total",
                 "hs_worker_mjc_published_total", "hs_projector_lag",
                 "hs_scheduler_ready_cores_mcpu", "hs_scheduler_running_cores_mcpu",
                 "hs_scheduler_instances", "hs_scheduler_cancellations_total",
                 "hs_completions_callbacks_pending", "hs_ingest_requests_total",
                 "hs_ingest_request_seconds_bucket"):
        assert name in used, name


def test_docs_table_lists_exactly_the_hs_metrics() -> None:
    exported_names()  # imports every service's metrics module
    families = {f.name + ("_total" if f.type == "counter" else "")
                for f in REGISTRY.collect() if f.name.startswith("hs_")}
    rows = re.findall(r"^\| `(hs_[a-z0-9_]+)`", DOCS.read_text(), flags=re.MULTILINE)
    assert len(rows) == len(set(rows)), "a metric is documented twice"
    assert set(rows) == families


def test_docs_promql_uses_only_exported_metrics() -> None:
    text = DOCS.read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, flags=re.DOTALL)
    assert blocks
    exported = exported_names()
    for block in blocks:
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                assert metric_names(line) <= exported, line
