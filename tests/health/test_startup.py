"""The class-data-sharing archive for command-line runs (``txmsg_health.startup``): which JVM
options a run gets, and how an archive written by a first run is put in place."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from txmsg_health import job, startup


@pytest.fixture(autouse=True)
def _no_pending() -> None:
    startup.pending = None


def test_first_run_writes_a_file_of_its_own_later_runs_map_the_archive(tmp_path: Path) -> None:
    env = {startup.ENV: str(tmp_path)}
    first = startup.java_options(env)
    tmp, final = startup.pending or ("", "")
    assert f"-XX:ArchiveClassesAtExit={tmp}" in first
    assert tmp == f"{final}.{os.getpid()}.tmp"
    assert "-Xlog:cds=off" in first
    # while that run's file exists and is fresh, another run neither writes nor maps one
    Path(tmp).write_bytes(b"x" * 10)
    startup.pending = None
    assert startup.java_options(env) == ""
    assert startup.pending is None
    # a settled file (its writer was killed before renaming it) is adopted
    later = time.time() + startup.SETTLED_SECONDS + 1
    assert startup.java_options(env, now=later) == f"-XX:SharedArchiveFile={final} {startup.QUIET}"
    assert os.path.isfile(final)
    assert not os.path.exists(tmp)
    assert startup.pending is None


def test_off_switch_and_unwritable_directory(tmp_path: Path) -> None:
    assert startup.java_options({startup.ENV: "off"}) == ""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert startup.java_options({startup.ENV: str(blocker / "sub")}) == ""
    assert startup.pending is None


def test_archive_is_keyed_by_pyspark_and_java_home(tmp_path: Path) -> None:
    a = startup.archive_path(str(tmp_path), {"JAVA_HOME": "/usr/lib/jvm/a"})
    b = startup.archive_path(str(tmp_path), {"JAVA_HOME": "/usr/lib/jvm/b"})
    assert a != b
    assert a.endswith(".jsa")


def test_only_a_session_that_launches_the_jvm_gets_it(spark: object) -> None:
    # the test session's JVM already runs: nothing to add, nothing pending, finish is a no-op
    job.build_session("local[2]", fast_start=True)
    assert startup.pending is None
    startup.finish()
    assert spark.range(3).count() == 3  # type: ignore[attr-defined]


def test_local_cores() -> None:
    assert job._local_cores("local[3]") == (True, 3)
    assert job._local_cores("local") == (True, 1)
    assert job._local_cores("local[*]") == (True, os.cpu_count() or 1)
    assert job._local_cores("local[2,4]") == (True, 2)
    assert job._local_cores("spark://h:7077")[0] is False
    assert job._local_cores(None)[0] is False
