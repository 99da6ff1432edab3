"""The discard finding says what txmsg's rescuer did, from the service's metrics (issue 39.5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from txmsg_health import job, rescues
from txmsg_health.inputs import HealthInputError

from txmsg.cli import main

# what the OpenTelemetry Prometheus exporter writes for txmsg.discards (tests/otel/test_dashboard.py
# pins the names: dots to underscores, {message} adds nothing, a counter ends in _total)
SCRAPE = """\
# HELP txmsg_discards_total half messages the broker discarded, as the rescuer handled them
# TYPE txmsg_discards_total counter
txmsg_discards_total{{messaging_system="rocketmq",txmsg_producer_group="{g}",txmsg_discard_outcome="rescued"}} {r}
txmsg_discards_total{{messaging_system="rocketmq",txmsg_producer_group="{g}",txmsg_discard_outcome="rolled_back"}} {b}
txmsg_discards_total{{messaging_system="rocketmq",txmsg_producer_group="{g}",txmsg_discard_outcome="retried"}} 0
txmsg_discards_total{{messaging_system="rocketmq",txmsg_producer_group="{g}",txmsg_discard_outcome="dead"}} {d}
# HELP txmsg_checks_total checks
# TYPE txmsg_checks_total counter
txmsg_checks_total{{txmsg_producer_group="{g}",txmsg_check_result="commit"}} 99
"""


def test_a_scrape_counts_outcomes_per_group_and_instances_add_up(tmp_path: Path) -> None:
    a = tmp_path / "a.prom"
    a.write_text(SCRAPE.format(g="pg-a", r=5, b=7, d=0))
    b = tmp_path / "b.prom"
    b.write_text(SCRAPE.format(g="pg-a", r=1, b=0, d=2) + SCRAPE.format(g="pg-b", r=3, b=0, d=0))
    assert rescues.parse(a.read_text()) == {
        "pg-a": {"rescued": 5, "rolled_back": 7, "retried": 0, "dead": 0}
    }
    assert rescues.read([str(a), str(b)]) == {
        "pg-a": {"rescued": 6, "rolled_back": 7, "retried": 0, "dead": 2},
        "pg-b": {"rescued": 3, "rolled_back": 0, "retried": 0, "dead": 0},
    }
    assert rescues.read([]) is None


def test_an_unreadable_source_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(HealthInputError, match=r"--rescue-metrics .*missing.*saved scrape"):
        rescues.read([str(tmp_path / "missing.prom")])
    r = CliRunner().invoke(
        main,
        ["health", str(tmp_path), "--out", str(tmp_path / "o"), "--rescue-metrics", "nope.prom"],
    )
    assert r.exit_code != 0
    assert "--rescue-metrics nope.prom: cannot read it" in r.output
    assert "Traceback" not in r.output


def test_the_finding_says_what_the_rescuer_did() -> None:
    def result() -> dict[str, object]:
        return {
            "groups": {
                "pg-a": {"discarded": 13, "reasons": ["discards: 13 messages discarded (limit 0)"]},
                "pg-b": {"discarded": 2, "reasons": ["broker-a: discards: 2 messages (limit 0)"]},
                "pg-c": {"discarded": 0, "reasons": ["unknown_share: 40%"]},
            }
        }

    without = result()
    rescues.annotate(without, None)
    a = without["groups"]["pg-a"]  # type: ignore[index]
    assert a["rescue"] is None
    assert a["reasons"][0].endswith(
        "is in the service's metrics (--rescue-metrics; docs/guide/discards.md)"
    )
    assert "rescue" not in without["groups"]["pg-c"]  # type: ignore[index]

    measured = result()
    rescues.annotate(measured, {"pg-a": {"rescued": 5, "rolled_back": 7, "retried": 1, "dead": 0}})
    a, b, c = (measured["groups"][g] for g in ("pg-a", "pg-b", "pg-c"))  # type: ignore[index]
    assert a["reasons"] == [
        "discards: 13 messages discarded (limit 0); txmsg's rescuer, by the service's metrics: "
        "5 sent again, 7 rolled back, 1 put back for another check horizon, none given up"
    ]
    assert "count no rescue for this group" in b["reasons"][0]  # a broker's name leads it
    assert b["rescue"] == {}
    assert c["reasons"] == ["unknown_share: 40%"]


def test_a_run_with_the_services_metrics(spark: object, real_logs: Path, tmp_path: Path) -> None:
    """The real 4.9.8 logs: every group discarded messages; one group's service reported its
    rescues, the others' did not."""
    first = job.run(
        spark,  # type: ignore[arg-type]
        job.JobConfig(
            inputs=[str(real_logs / "info")], out=str(tmp_path / "plain"), dashboard=False
        ),
    ).summary
    groups = sorted(g for g, v in first["groups"].items() if v["discarded"])
    assert len(groups) >= 2
    scrape = tmp_path / "service.prom"
    scrape.write_text(SCRAPE.format(g=groups[0], r=2, b=1, d=1))
    s = job.run(
        spark,  # type: ignore[arg-type]
        job.JobConfig(
            inputs=[str(real_logs / "info")],
            out=str(tmp_path / "measured"),
            dashboard=False,
            rescue_metrics=[str(scrape)],
        ),
    ).summary
    assert s["flagged"] == first["flagged"]  # the rescue does not clear the group: it discarded
    one = s["groups"][groups[0]]
    assert one["rescue"] == {"rescued": 2, "rolled_back": 1, "retried": 0, "dead": 1}
    assert any("2 sent again, 1 rolled back" in r and "1 given up" in r for r in one["reasons"])
    other = s["groups"][groups[1]]
    assert other["rescue"] == {}
    assert any("count no rescue for this group" in r for r in other["reasons"])
    plain = first["groups"][groups[0]]
    assert plain["rescue"] is None
    assert any("--rescue-metrics" in r for r in plain["reasons"])
