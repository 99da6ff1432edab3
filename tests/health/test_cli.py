"""`txmsg health` and the job module's own entry points, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from txmsg_health import job
from txmsg_health.cli import health

from txmsg.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_cli_runs_in_the_shared_session(spark: object, real_logs: Path, tmp_path: Path) -> None:
    # spark fixture first: build_session's getOrCreate then reuses the test session
    r = CliRunner().invoke(
        main,
        [
            "health",
            str(real_logs / "info"),
            "--out",
            str(tmp_path),
            "--master",
            "local[2]",
            "--tz",
            "+08:00",
            "--window",
            "hour",
            "--max-discards",
            "1000000",
            "--max-undelivered-checks",
            "-1",
        ],
    )
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
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "txmsg_health.job",
            str(tmp_path / "missing.log"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "no such file or directory" in p.stderr


def test_spark_submit_runs_the_job_file(real_logs: Path, tmp_path: Path) -> None:
    """The cluster path: spark-submit of the job file itself, same arguments."""
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    p = subprocess.run(
        [
            str(submit),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            str(REPO / "spark" / "txmsg_health" / "job.py"),
            str(real_logs / "debug" / "*.log"),
            "--out",
            str(tmp_path),
            "--no-dashboard",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["groups"]
    assert all(g["commit"] is not None for g in s["groups"].values())
    assert (tmp_path / "metrics_by_window.parquet").is_dir()


class _Stop(Exception):
    """Raised by the stand-in for ``build_session``: the test needs the arguments, not a JVM."""


def _what_each_entry_point_runs(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The session arguments and job configuration ``txmsg health ARGS`` and
    ``python -m txmsg_health.job ARGS`` end up with (in this process, no Spark)."""
    seen: list[dict[str, Any]] = []
    real_config = job.JobConfig

    def config(**kw: Any) -> job.JobConfig:
        seen.append({"cfg": real_config(**kw)})
        return seen[-1]["cfg"]

    def session(
        master: str | None = None, conf: dict[str, str] | None = None, *, fast_start: bool = False
    ) -> object:
        seen[-1].update(master=master, conf=conf, fast_start=fast_start)
        raise _Stop

    monkeypatch.setattr(job, "JobConfig", config)
    monkeypatch.setattr(job, "build_session", session)
    r = CliRunner().invoke(main, ["health", *args])
    assert isinstance(r.exception, _Stop), r.output
    with pytest.raises(_Stop):
        job.main(args)
    assert len(seen) == 2
    return seen[0], seen[1]


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--follow", "--trigger", "5s"],
        [
            "--master",
            "local[1]",
            "--window",
            "hour",
            "--tz",
            "+00:00",
            "--conf",
            "a.b=c=d",
            "--max-undelivered-checks",
            "-1",
            "--max-discards",
            "3",
            "--no-dashboard",
            "--broker-regex",
            "(broker-[a-z])",
            "--parquet-uri",
            "/tmp/p",
        ],
    ],
)
def test_both_entry_points_run_the_same_job(
    monkeypatch: pytest.MonkeyPatch, real_logs: Path, tmp_path: Path, extra: list[str]
) -> None:
    """One set of options and defaults (the --master default included) for every entry point."""
    args = [str(real_logs / "info"), "--out", str(tmp_path / "o"), *extra]
    cli_run, module_run = _what_each_entry_point_runs(monkeypatch, args)
    assert cli_run == module_run


def test_job_module_help_is_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert job.main(["--help"]) == 0
    own = capsys.readouterr().out
    expected = CliRunner().invoke(health, ["--help"], prog_name="txmsg_health.job").output
    assert own.split() == expected.split()  # the same text, wrapped to either terminal's width
    assert "--master" in own


def test_a_spark_failure_a_setting_fixes_is_one_line_naming_it() -> None:
    """An out-of-memory JVM (its error, or the refused connection once it has exited) and an
    oversize result each end in one line naming the setting to raise; other errors pass through."""
    oom = job.spark_failure(
        RuntimeError("An error occurred ... java.lang.OutOfMemoryError: Java heap space")
    )
    assert oom is not None
    assert "spark.driver.memory" in oom
    assert "\n" not in oom
    gone = job.spark_failure(ConnectionRefusedError(111, "Connection refused"))
    assert gone is not None
    assert "exited" in gone
    big = job.spark_failure(
        RuntimeError(
            "Total size of serialized results of 2 tasks (16.8 MiB) is bigger than spark.driver.maxResultSize (16.0 MiB)"
        )
    )
    assert big is not None
    assert "spark.driver.maxResultSize" in big
    assert job.spark_failure(ValueError("something else")) is None


def test_an_oversize_result_ends_in_one_line(tmp_path: Path, real_logs: Path) -> None:
    """A real Spark failure through the command line: results capped below what the job needs
    give the one line and exit 1, no traceback."""
    out = tmp_path / "out"
    p = subprocess.run(
        [
            str(Path(sys.executable).with_name("txmsg")),
            "health",
            str(real_logs / "debug"),
            "--out",
            str(out),
            "--no-dashboard",
            "--conf",
            "spark.driver.maxResultSize=2k",
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "spark.driver.maxResultSize" in last
