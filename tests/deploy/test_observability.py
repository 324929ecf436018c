"""The Grafana dashboard and the Prometheus alerts name only metrics the services export.

The exported set is read from the code: every OpenTelemetry instrument created in libs/ (the
``meter.create_*`` calls and the bounded ``Counter``/``Histogram`` wrappers of
``agentledger.telemetry.metrics``), by name, kind and unit, mapped to the names Prometheus
shows. The services push OTLP to the collector (deploy/otel/collector.yaml), whose
``prometheus`` exporter translates with the OpenTelemetry → Prometheus rule implemented in
``prometheus_names`` (and pinned by a test below): so renaming an instrument, or changing its
unit, fails here until the dashboard and the alerts follow.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from agentledger.telemetry import metrics as telemetry_metrics

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / "libs"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "agentledger.json"
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOK_PREFIX = "https://github.com/agentledger/agentledger/blob/main/docs/operations.md#"


class Instrument(NamedTuple):
    name: str  # the OpenTelemetry name, e.g. agentledger.relay.lag
    kind: str  # counter, up_down_counter, histogram, gauge
    unit: str


_CREATE = {
    "create_counter": "counter", "create_observable_counter": "counter",
    "create_up_down_counter": "up_down_counter",
    "create_observable_up_down_counter": "up_down_counter",
    "create_histogram": "histogram", "create_gauge": "gauge",
    "create_observable_gauge": "gauge",
    # agentledger.telemetry.metrics' wrappers, which check labels and then call create_*
    "Counter": "counter", "Histogram": "histogram",
}


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "string"`` assignments (instrument names kept in constants)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _string(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def exported_instruments() -> set[Instrument]:
    """Every instrument libs/ creates with a literal (or constant) ``agentledger.*`` name."""
    found = set()
    for path in LIBS.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        constants = _constants(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else None
            if called not in _CREATE:
                continue
            names = [s for s in (_string(a, constants) for a in node.args)
                     if s and s.startswith("agentledger.")]
            if not names:
                continue  # the wrappers' own create_* calls pass a variable
            unit = next((_string(k.value, constants) for k in node.keywords if k.arg == "unit"),
                        None) or ""
            found.add(Instrument(names[0], _CREATE[called], unit))
    return found


# The OpenTelemetry → Prometheus rule of the collector's prometheus exporter (its default,
# suffixes on): UCUM units that have a Prometheus word; annotations ({…}) add none.
_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
          "min": "minutes", "h": "hours", "d": "days", "By": "bytes", "KiBy": "kibibytes",
          "MiBy": "mebibytes", "GiBy": "gibibytes", "KBy": "kilobytes", "MBy": "megabytes",
          "bit": "bits", "%": "percent"}


def prometheus_names(instrument: Instrument) -> set[str]:
    """The series names Prometheus shows for one OpenTelemetry instrument."""
    name = re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9_:]", "_", instrument.name))
    unit = "" if instrument.unit.startswith("{") else _UNITS.get(instrument.unit, "")
    if instrument.unit == "1" and instrument.kind == "gauge":
        unit = "ratio"
    if unit and not name.endswith(f"_{unit}"):
        name = f"{name}_{unit}"
    if instrument.kind == "counter":
        return {f"{name}_total"}
    if instrument.kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def label_name(attribute: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def _relay_attributes() -> set[str]:
    """Attribute keys the relay's instruments record (dict literals in relay/metrics.py)."""
    tree = ast.parse((LIBS / "agentledger" / "relay" / "metrics.py").read_text())
    return {k.value for node in ast.walk(tree) if isinstance(node, ast.Dict)
            for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


EXPORTED = exported_instruments()
SERIES = {series: i for i in EXPORTED for series in prometheus_names(i)}
# Labels a query may use: the bounded attribute names, and Prometheus' own (le on buckets;
# job and instance from the collector's service.name / service.instance.id).
LABELS = {label_name(a) for a in telemetry_metrics.LABELS | _relay_attributes()} | \
    {"le", "job", "instance"}

# ----------------------------------------------------------------------------- PromQL
_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes",
    "clamp_max", "clamp_min", "count", "count_over_time", "delta", "deriv", "floor",
    "group", "histogram_quantile", "idelta", "increase", "irate", "label_replace", "max",
    "max_over_time", "min", "min_over_time", "quantile", "quantile_over_time", "rate",
    "resets", "round", "scalar", "sort", "sort_desc", "stddev", "sum", "sum_over_time",
    "time", "timestamp", "topk", "vector",
}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset"}


class Query(NamedTuple):
    metrics: set[str]
    labels: set[str]


def parse_promql(expr: str) -> Query:
    """The metric and label names a PromQL expression reads.

    Not a full parser: enough for these files, and strict — an identifier that is neither a
    function, a keyword, a label nor a number counts as a metric name, so a typo is caught.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables ($__rate_interval)
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    text = re.sub(r"\{[^}]*\}", "", text)
    for grouping in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*"
                               r"\(([^)]*)\)", text):
        labels |= {g.strip() for g in grouping.split(",") if g.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call and word in _FUNCTIONS:
            continue
        assert not call, f"unknown function {word}( in {expr!r}"
        if word not in _KEYWORDS and not re.fullmatch(r"(?:Inf|NaN|e\d*)", word):
            names.add(word)
    return Query(names, labels)


def _alerts() -> dict[str, Any]:
    return dict(yaml.safe_load(ALERTS.read_text()))


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _alerts()["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _targets() -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _dashboard()["panels"]
            for target in panel.get("targets", [])]


# ----------------------------------------------------------------------------- the rule
def test_the_naming_rule_matches_the_otel_prometheus_translation() -> None:
    assert prometheus_names(Instrument("agentledger.relay.lag", "histogram", "ms")) == {
        "agentledger_relay_lag_milliseconds_bucket", "agentledger_relay_lag_milliseconds_sum",
        "agentledger_relay_lag_milliseconds_count"}
    assert prometheus_names(Instrument("agentledger.relay.slot.retained_wal", "gauge", "By")) \
        == {"agentledger_relay_slot_retained_wal_bytes"}
    assert prometheus_names(Instrument("agentledger.admissions", "counter", "{proposal}")) \
        == {"agentledger_admissions_total"}
    assert prometheus_names(Instrument("agentledger.attempt.duration", "histogram", "s")) >= \
        {"agentledger_attempt_duration_seconds_bucket"}
    assert prometheus_names(Instrument("x.duration_seconds", "gauge", "s")) == \
        {"x_duration_seconds"}  # a unit already in the name is not repeated
    assert label_name("topic.family") == "topic_family"


def test_the_exported_set_is_read_from_the_code() -> None:
    names = {i.name: i for i in EXPORTED}
    # Both styles of creation are found: the wrappers and the relay's own meter calls.
    assert names["agentledger.dispatch.outcomes"] == \
        Instrument("agentledger.dispatch.outcomes", "counter", "{command}")
    assert names["agentledger.relay.lag"] == Instrument("agentledger.relay.lag", "histogram", "ms")
    assert names["agentledger.relay.slot.retained_wal"].kind == "gauge"
    # The alerts' own signals, with the kind and unit their Prometheus names rely on.
    assert names["agentledger.commands.unknown"] == Instrument(
        "agentledger.commands.unknown", "gauge", "{command}")
    assert names["agentledger.commands.unknown.oldest_age"] == Instrument(
        "agentledger.commands.unknown.oldest_age", "gauge", "s")
    for counter, unit in (("agentledger.dead_letters", "{message}"),
                          ("agentledger.leases.expired", "{claim}"),
                          ("agentledger.retries.capped", "{command}")):
        assert names[counter] == Instrument(counter, "counter", unit)
    assert len(names) == len(EXPORTED), "one instrument name created with two kinds or units"


def test_promql_reader_finds_metrics_and_labels() -> None:
    query = parse_promql('histogram_quantile(0.99, sum by (le, topic_family) (rate('
                         'agentledger_relay_lag_milliseconds_bucket{slot!="a b"}'
                         '[$__rate_interval]))) > 5 * 1024 or vector(0)')
    assert query == Query({"agentledger_relay_lag_milliseconds_bucket"},
                          {"le", "topic_family", "slot"})
    assert parse_promql("agentledger_relay_lag_ms_bucket > 1e3").metrics == \
        {"agentledger_relay_lag_ms_bucket"}


# ----------------------------------------------------------------------------- the assets
@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_metric_named_is_one_the_services_export(source: str) -> None:
    queries = [(r["alert"], r["expr"]) for r in _rules()] if source == "alerts" else _targets()
    assert queries
    for where, expr in queries:
        query = parse_promql(expr)
        assert query.metrics, f"{where}: no metric in {expr!r}"
        unknown = query.metrics - set(SERIES)
        assert not unknown, f"{where}: {sorted(unknown)} is exported by nothing in libs/; " \
                            f"known: {sorted(SERIES)}"
        assert query.labels <= LABELS, f"{where}: labels {sorted(query.labels - LABELS)}"


def test_the_alerts_cover_the_signals_the_issue_names() -> None:
    read = set().union(*(parse_promql(r["expr"]).metrics for r in _rules()))
    for signal in ("agentledger_relay_lag_milliseconds_bucket",
                   "agentledger_relay_slot_retained_wal_bytes",
                   "agentledger_commands_unknown", "agentledger_commands_unknown_oldest_age_seconds",
                   "agentledger_dead_letters_total", "agentledger_leases_expired_total",
                   "agentledger_retries_capped_total"):
        assert signal in read, signal
    shown = set().union(*(parse_promql(expr).metrics for _, expr in _targets()))
    assert read <= shown, f"alerted on but not on the dashboard: {sorted(read - shown)}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_alert_rules_are_well_formed_and_each_has_its_runbook() -> None:
    alerts = _alerts()
    assert set(alerts) == {"groups"}
    operations = OPERATIONS.read_text()
    anchors = _anchors(operations)
    seen = set()
    for group in alerts["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"], group.get("name")
        for rule in group["rules"]:
            name = rule["alert"]
            assert name not in seen, f"{name} twice"
            seen.add(name)
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, name
            assert re.fullmatch(r"\d+[smh]", rule["for"]), name
            assert rule["labels"] == {"severity": rule["labels"]["severity"]}, name
            assert rule["labels"]["severity"] in {"warning", "critical"}, name
            notes = rule["annotations"]
            assert set(notes) == {"summary", "description", "runbook_url"}, name
            url = notes["runbook_url"]
            assert url == RUNBOOK_PREFIX + name.lower(), f"{name}: {url}"
            assert name.lower() in anchors, f"{name}: no '### {name}' section in operations.md"
            section = operations.split(f"### {name}\n", 1)[1].split("\n#", 1)[0]
            for part in ("**Means**", "**Confirm**", "**Do**"):
                assert part in section, f"{name}: its runbook has no {part}"


def test_dashboard_is_grafana_shaped() -> None:
    dashboard = _dashboard()
    assert {"uid", "title", "schemaVersion", "panels", "templating", "time"} <= set(dashboard)
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    graphs = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(graphs) >= 10
    for panel in graphs:
        assert panel["type"] in {"timeseries", "stat", "gauge", "bargauge", "table"}, panel
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
