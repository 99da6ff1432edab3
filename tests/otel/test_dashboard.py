"""The Grafana dashboard queries exactly what a run exports (issue 28).

``txmsg demo`` runs with its Prometheus endpoint on, in a child process (demo_metrics_child.py),
and its scrapes are compared with ``docs/grafana/txmsg-dashboard.json``:

* each instrument of :data:`txmsg.otel.names.INSTRUMENTS` is exported under the name the
  OpenTelemetry Prometheus exporter gives it: dots become underscores, the unit is appended as a
  suffix (``s`` -> ``_seconds``; annotations in braces such as ``{message}`` add nothing),
  counters end in ``_total``, histograms are exported as ``_bucket``, ``_sum`` and ``_count``;
* every metric name the dashboard's queries use is one the run exported, every label name one it
  carried, and every instrument appears in at least one query.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from txmsg.otel import names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana" / "txmsg-dashboard.json"
CHILD = Path(__file__).with_name("demo_metrics_child.py")
_SUFFIX = {"s": "_seconds"}


def prometheus_names(name: str, kind: str, unit: str) -> list[str]:
    """The sample names the OpenTelemetry Prometheus exporter gives an instrument."""
    base = name.replace(".", "_") + ("" if unit.startswith("{") else _SUFFIX[unit])
    if kind == "counter":
        return [base + "_total"]
    if kind == "histogram":
        return [base + "_bucket", base + "_sum", base + "_count"]
    return [base]


def test_prometheus_names_follow_the_exporter_rules() -> None:
    assert prometheus_names("txmsg.check.duration", "histogram", "s") == [
        "txmsg_check_duration_seconds_bucket",
        "txmsg_check_duration_seconds_sum",
        "txmsg_check_duration_seconds_count",
    ]
    assert prometheus_names("txmsg.checks", "counter", "{check}") == ["txmsg_checks_total"]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    workdir = tmp_path_factory.mktemp("demo-metrics")
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(workdir / "demo")],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert "EXIT 0" in proc.stdout, proc.stdout + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    samples = {line.split()[1] for line in lines if line.startswith("SCRAPED ")}
    labels = {line.split()[1] for line in lines if line.startswith("LABEL ")}
    return samples, labels


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_instrument_is_exported_under_its_prometheus_name(
    scraped: tuple[set[str], set[str]],
) -> None:
    samples, labels = scraped
    for name, (kind, unit) in names.INSTRUMENTS.items():
        missing = set(prometheus_names(name, kind, unit)) - samples
        assert not missing, f"{name}: {missing} not exported"
    for attribute in (names.PRODUCER_GROUP, names.CONSUMER_GROUP, names.DESTINATION):
        assert attribute.replace(".", "_") in labels


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dashboard_queries_only_exported_names(scraped: tuple[set[str], set[str]]) -> None:
    samples, labels = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    used = set()
    for expr in exprs:
        for token in re.findall(r"\b((?:txmsg|messaging|error)_[a-z0-9_]+)\b", expr):
            assert token in samples or token in labels, f"{token!r} in {expr!r} is not exported"
            if token in samples:
                used.add(token)
    for name, (kind, unit) in names.INSTRUMENTS.items():
        assert used & set(prometheus_names(name, kind, unit)), f"no panel shows {name}"
