"""The shipped Prometheus rules and Grafana dashboard (outbox/monitoring/) against the code:
every metric they query is one the relay or the inbox exports, every metric exported is on the
dashboard, every alert has a runbook section, and promtool passes the rules and their unit
tests (tests/monitoring/alerts_test.yml: each alert fires and stays silent at least once)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from inbox import InboxMetrics
from relay import RelayMetrics
from relay.fleet import FleetMetrics
from tests.support.services import missing

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
MONITORING = files("outbox") / "monitoring"
RUNBOOKS = ROOT / "docs" / "how-to" / "alerts.md"

#: metrics that Prometheus itself makes: a target's scrape
PROMETHEUS_OWN = {"up"}


def _rules() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(MONITORING.joinpath("alerts.yml").read_text())
    return document


def _alerts() -> Iterator[dict[str, Any]]:
    for group in _rules()["groups"]:
        yield from group["rules"]


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(MONITORING.joinpath("dashboard.json").read_text())
    return document


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def exported() -> dict[str, set[str]]:
    """Each metric family the relay and the inbox export, with the names of its samples
    (prometheus_client's: a counter's ``_total``, a histogram's ``_bucket``, ...)."""
    registries: list[Any] = [RelayMetrics.prometheus().registry]
    fleet = FleetMetrics.prometheus()  # a relay serving many databases: its own families
    fleet.member("one")
    registries.append(fleet.registry)
    inbox_registry = CollectorRegistry()
    InboxMetrics.prometheus(inbox_registry)
    registries.append(inbox_registry)
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
    }
    families: dict[str, set[str]] = {}
    for registry in registries:
        for family in registry.collect():
            families[family.name] = {family.name + s for s in suffixes[family.type]}
    return families


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"\b(?:outbox|inbox)_[a-z0-9_]+\b|\bup\b")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label values and strings left out)."""
    return set(_NAME.findall(_STRING.sub('""', expr)))


def test_metric_names_are_read_from_promql_not_from_label_values() -> None:
    expr = 'max by (topic) (outbox_backlog{slot="outbox_app"}) * on (job) up{job="outbox-relay"}'
    assert metric_names(expr) == {"outbox_backlog", "up"}


def test_every_metric_the_rules_query_is_exported_by_the_code() -> None:
    samples = set().union(*exported().values()) | PROMETHEUS_OWN
    used: set[str] = set()
    for rule in _alerts():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']} reads no metric"
        used |= names
    assert sorted(used - samples) == [], "rules query metrics the code does not export"
    assert len(used) >= 15


def test_every_metric_the_dashboard_queries_is_exported_and_every_family_is_shown() -> None:
    families = exported()
    samples = set().union(*families.values()) | PROMETHEUS_OWN
    used = set().union(*map(metric_names, _dashboard_exprs()))
    assert sorted(used - samples) == [], "the dashboard queries metrics the code does not export"
    unseen = [f for f, names in families.items() if not names & used]
    assert unseen == [], f"exported metrics missing from the dashboard: {unseen}"


def test_dashboard_has_a_row_per_area_and_well_formed_panels() -> None:
    dashboard = _dashboard()
    panels = dashboard["panels"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == [
        "Relay", "WAL capture", "Consumers (inbox)", "Reconciliation",
        "Databases (one relay for many)",
    ]  # fmt: skip
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert "datasource" in variables
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_alert_has_a_severity_summary_and_a_runbook_section() -> None:
    page = RUNBOOKS.read_text()
    sections = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,4} (.+)$", page, flags=re.MULTILINE)
    }
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names))
    for rule in _alerts():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        notes = rule["annotations"]
        assert notes["summary"], rule["alert"]
        assert notes["description"], rule["alert"]
        page_path, anchor = notes["runbook_url"].split("#")
        assert page_path == "docs/how-to/alerts.md"
        assert anchor == rule["alert"].lower()
        assert anchor in sections, f"docs/how-to/alerts.md has no section {rule['alert']}"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        missing("promtool", "apt-get install prometheus (Debian's package ships promtool)")
    return path


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_shipped_rules() -> None:
    out = _run(_promtool(), "check", "rules", str(MONITORING.joinpath("alerts.yml")))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(list(_alerts()))} rules found" in out.stdout


def test_every_rule_has_a_promtool_unit_test_that_fires_and_one_that_does_not() -> None:
    tests = yaml.safe_load((HERE / "alerts_test.yml").read_text())["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in _alerts()}
    assert sorted(names - firing) == [], "alerts with no firing test"
    assert sorted(names - silent) == [], "alerts with no silent test"


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    """The unit tests run on the rules without their annotations (promtool compares those too;
    alerts_annotations_test.yml renders the templated ones on the shipped file as it is)."""
    promtool = _promtool()
    rules = _rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            del rule["annotations"]
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(HERE / "alerts_test.yml", tmp_path / "alerts_test.yml")
    out = _run(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    out = _run(promtool, "test", "rules", "alerts_annotations_test.yml", cwd=HERE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A rule whose threshold moved fails its unit test: the tests check the rules."""
    promtool = _promtool()
    rules = _rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            del rule["annotations"]
            if rule["alert"] == "OutboxOldestPendingTooOld":
                rule["expr"] = rule["expr"].replace("> 300", "> 3000")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(HERE / "alerts_test.yml", tmp_path / "alerts_test.yml")
    out = _run(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode != 0
    assert "OutboxOldestPendingTooOld" in out.stdout + out.stderr


@pytest.mark.parametrize("name", ["alerts.yml", "dashboard.json"])
def test_the_files_ship_in_the_package(name: str) -> None:
    assert MONITORING.joinpath(name).is_file()
