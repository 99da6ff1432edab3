"""A local-mode health job binds its driver to 127.0.0.1 unless the user chose an address.

Spark's own default is the first non-loopback interface when the hostname resolves to loopback,
with the warning "hostname ... resolves to a loopback address ...; using <address> instead".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from txmsg_health import loopback

WARNING = "resolves to a loopback address"
USER_ENV = loopback.ENV_KEYS


def _clean_env() -> dict[str, str]:
    """This process's environment without the user's driver-address settings."""
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV and k != "PYSPARK_GATEWAY_PORT"}
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def test_job_in_local_mode_binds_driver_to_loopback_without_the_warning(
    real_logs: Path, tmp_path: Path
) -> None:
    """The job's own entry point in a fresh JVM: no warning on stderr, driver on 127.0.0.1."""
    script = textwrap.dedent(f"""
        import json
        from pyspark import SparkContext
        from txmsg_health import job
        rc = job.main([{str(real_logs / "info" / "transaction.log")!r}, "--out", {str(tmp_path)!r},
                       "--master", "local[1]", "--no-dashboard", "--conf", "spark.ui.enabled=false"])
        conf = SparkContext._active_spark_context.getConf()
        print("DRIVER " + json.dumps({{"rc": rc, "host": conf.get("spark.driver.host"),
                                      "bind": conf.get("spark.driver.bindAddress")}}))
    """)
    p = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=540,
        env=_clean_env(),
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert WARNING not in p.stderr, p.stderr[-2000:]
    driver = json.loads(p.stdout.split("DRIVER ", 1)[1])
    assert driver["rc"] == 0
    assert driver["host"] == loopback.LOOPBACK
    assert driver["bind"] in (None, loopback.LOOPBACK)  # unset: Spark binds to spark.driver.host
    assert (tmp_path / "summary.json").is_file()
    assert "SPARK_LOCAL_IP" not in p.stdout  # nothing leaked into the job's output either


def test_the_shared_session_driver_is_on_loopback(spark: object) -> None:
    if any(os.environ.get(k) for k in USER_ENV):
        pytest.skip(f"the environment sets {'/'.join(USER_ENV)}: the user's address wins")
    conf = spark.sparkContext.getConf()  # type: ignore[attr-defined]
    assert conf.get("spark.driver.host") == loopback.LOOPBACK
    assert all(k not in os.environ for k in USER_ENV), "launch_env must restore the environment"


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", " local-cluster[2,1,512]"])
def test_local_masters_get_loopback(master: str) -> None:
    assert loopback.driver_conf(master, {}, {}) == {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


@pytest.mark.parametrize("master", [None, "", "spark://h:7077", "yarn", "k8s://https://h:443"])
def test_other_masters_are_left_alone(master: str | None) -> None:
    assert loopback.driver_conf(master, {}, {}) == {}


@pytest.mark.parametrize(
    ("conf", "environ"),
    [
        ({"spark.driver.host": "10.0.0.5"}, {}),
        ({"spark.driver.bindAddress": "0.0.0.0"}, {}),  # noqa: S104 - a user's setting as data: nothing binds
        ({}, {"SPARK_LOCAL_IP": "10.0.0.5"}),
        ({}, {"SPARK_LOCAL_HOSTNAME": "myhost"}),
    ],
)
def test_the_users_choice_wins(conf: dict[str, str], environ: dict[str, str]) -> None:
    assert loopback.driver_conf("local[*]", conf, environ) == {}


def test_launch_env_sets_loopback_only_for_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in USER_ENV:
        monkeypatch.delenv(k, raising=False)
    with loopback.launch_env("local[2]", {}):
        assert {k: os.environ[k] for k in USER_ENV} == dict.fromkeys(USER_ENV, "127.0.0.1")
    assert all(k not in os.environ for k in USER_ENV)


def test_launch_env_keeps_the_users_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.5")
    monkeypatch.delenv("SPARK_LOCAL_HOSTNAME", raising=False)
    with loopback.launch_env("local[2]", {}):
        assert os.environ["SPARK_LOCAL_IP"] == "10.0.0.5"
        assert "SPARK_LOCAL_HOSTNAME" not in os.environ
    with loopback.launch_env("local[2]", {"spark.driver.host": "h"}):
        assert "SPARK_LOCAL_HOSTNAME" not in os.environ
    with loopback.launch_env("spark://h:7077", {}):
        assert "SPARK_LOCAL_HOSTNAME" not in os.environ
