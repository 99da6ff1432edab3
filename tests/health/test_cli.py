"""`txmsg health` and the job module's own entry points, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from txmsg.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_cli_runs_in_the_shared_session(spark: object, real_logs: Path, tmp_path: Path) -> None:
    # spark fixture first: build_session's getOrCreate then reuses the test session
    r = CliRunner().invoke(main, ["health", str(real_logs / "info"), "--out", str(tmp_path),
                                  "--master", "local[2]", "--tz", "+08:00", "--window", "hour",
                                  "--max-discards", "1000000", "--max-undelivered-checks", "-1"])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["window"] == "hour"
    assert s["flagged"]
    assert all("discards" not in " ".join(g["reasons"]) for g in s["groups"].values())
    assert "flagged" in r.output
    assert (tmp_path / "dashboard.html").is_file()


def test_cli_empty_input_fails_with_a_message(spark: object, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "transaction.log").write_text("")
    r = CliRunner().invoke(main, ["health", str(tmp_path / "in"), "--out", str(tmp_path / "o")])
    assert r.exit_code != 0
    assert "empty" in r.output
    assert "log directory" in r.output


def test_job_module_rejects_missing_path_before_starting_spark(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "txmsg_health.job", str(tmp_path / "missing.log"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "no such file or directory" in p.stderr


def test_spark_submit_runs_the_job_file(real_logs: Path, tmp_path: Path) -> None:
    """The cluster path: spark-submit of the job file itself, same arguments."""
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    p = subprocess.run(
        [str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         str(REPO / "spark" / "txmsg_health" / "job.py"),
         str(real_logs / "debug" / "*.log"), "--out", str(tmp_path), "--no-dashboard"],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["groups"]
    assert all(g["commit"] is not None for g in s["groups"].values())
    assert (tmp_path / "metrics_by_window.parquet").is_dir()
