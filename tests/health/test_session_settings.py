"""Which settings the health job gives Spark's session builder (``job.build_session``).

JVM options are the job's only for a driver JVM it launches itself in local mode: on a cluster
the executors' and the driver's JVMs are the cluster's (its spark-defaults.conf, spark-submit's
``--conf``), and any value the user set stays. No JVM is started here: the builder is a fake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from txmsg_health import job, loopback

DRIVER = "spark.driver.extraJavaOptions"
EXECUTOR = "spark.executor.extraJavaOptions"
CLUSTERS = ["spark://host:7077", "yarn", "k8s://https://host:443", "local-cluster[2,1,1024]"]


class _Builder:
    """Records what ``build_session`` gives SparkSession.builder; ``getOrCreate`` starts nothing."""

    def __init__(self) -> None:
        self.master_url: str | None = None
        self.options: dict[str, str] = {}

    def appName(self, name: str) -> _Builder:
        return self

    def master(self, url: str) -> _Builder:
        self.master_url = url
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.options[key] = value
        return self

    def getOrCreate(self) -> Any:
        class _Context:
            def setLogLevel(self, level: str) -> None:
                pass

        class _Session:
            sparkContext = _Context()

        return _Session()


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _Builder:
    """A fake builder, a process whose next session launches the driver JVM, no spark-defaults."""
    fake = _Builder()
    monkeypatch.setattr(SparkSession, "builder", fake)
    monkeypatch.setattr(loopback, "jvm_running", lambda: False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "no-conf"))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("TXMSG_SPARK_CDS", "off")
    return fake


@pytest.mark.parametrize("master", CLUSTERS)
def test_a_cluster_keeps_its_own_jvm_options(builder: _Builder, master: str) -> None:
    job.build_session(master, fast_start=True)
    assert builder.master_url == master
    assert DRIVER not in builder.options
    assert EXECUTOR not in builder.options


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]"])
def test_local_mode_tunes_the_driver_jvm(builder: _Builder, master: str) -> None:
    job.build_session(master, fast_start=True)
    assert builder.options[DRIVER] == job.JVM_OPTIONS
    # a local executor runs inside the driver JVM: an executor option would change nothing
    assert EXECUTOR not in builder.options


def test_conf_value_is_kept(builder: _Builder) -> None:
    job.build_session("local[2]", {DRIVER: "-Xss8m", EXECUTOR: "-Xss4m"}, fast_start=True)
    assert builder.options[DRIVER] == "-Xss8m"
    assert builder.options[EXECUTOR] == "-Xss4m"


def test_spark_defaults_value_is_kept(builder: _Builder, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-submit (which launches the JVM) applies spark-defaults.conf unless the job overrides it."""
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "# site settings\n\nspark.master  local[4]\nspark.driver.extraJavaOptions   -XX:+UseG1GC -Dsite=1\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    job.build_session("local[2]", fast_start=True)
    assert DRIVER not in builder.options


def test_properties_file_of_pyspark_submit_args_is_kept(builder: _Builder, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    props = tmp_path / "my.conf"
    props.write_text("spark.driver.extraJavaOptions=-Dmine=1\n")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--properties-file {props} pyspark-shell")
    job.build_session("local[2]")
    assert DRIVER not in builder.options


def test_a_running_jvm_is_left_alone(builder: _Builder, monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-submit, or a SparkConf/session made earlier: the driver JVM and its options exist."""
    monkeypatch.setattr(loopback, "jvm_running", lambda: True)
    monkeypatch.setattr(loopback, "session_conf", lambda master, conf: {})
    job.build_session("local[2]", fast_start=True)
    assert DRIVER not in builder.options
    assert EXECUTOR not in builder.options


def test_no_master_is_local_unless_spark_submit_chose_one(
        builder: _Builder, monkeypatch: pytest.MonkeyPatch) -> None:
    job.build_session(None)
    assert builder.master_url == job.DEFAULT_MASTER
    assert builder.options[DRIVER] == job.JVM_OPTIONS
    # under spark-submit its JVM runs (no SparkContext yet): its --master is kept
    spark_submit = _Builder()
    monkeypatch.setattr(SparkSession, "builder", spark_submit)
    monkeypatch.setattr(loopback, "jvm_running", lambda: True)
    monkeypatch.setattr(loopback, "session_conf", lambda master, conf: {})
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    job.build_session(None)
    assert spark_submit.master_url is None
    assert DRIVER not in spark_submit.options


def test_settings_without_a_builder() -> None:
    """The pure function behind ``build_session``: what a caller can check without Spark."""
    for master in CLUSTERS:
        s = job.session_settings(master)
        assert DRIVER not in s
        assert EXECUTOR not in s
        assert "spark.sql.adaptive.enabled" not in s  # a cluster keeps adaptive execution
    local = job.session_settings("local[2]")
    assert local[DRIVER] == job.JVM_OPTIONS
    assert local["spark.sql.shuffle.partitions"] == "2"
    assert job.session_settings("local[2]", {DRIVER: "-Dx"})[DRIVER] == "-Dx"
    assert DRIVER not in job.session_settings("local[2]", user_set={DRIVER})
    assert DRIVER not in job.session_settings("local[2]", launches_jvm=False)


def test_spark_defaults_file_parsing(tmp_path: Path) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\n! comment\n  spark.a   1 2\nspark.b=x\nspark.c:y\nspark.d\n")
    keys = job.user_spark_keys({"SPARK_CONF_DIR": str(tmp_path)})
    assert {"spark.a", "spark.b", "spark.c", "spark.d"} <= keys
    assert not {"#", "!", "comment", "1", "2"} & keys
    submit = job.user_spark_keys({"SPARK_CONF_DIR": str(tmp_path / "none"), "PYSPARK_SUBMIT_ARGS":
                                  "--conf spark.x=1 --conf=spark.y=2 --driver-java-options -Dz "
                                  "pyspark-shell"})
    assert submit == {"spark.x", "spark.y", DRIVER}
    assert job.user_spark_keys({"SPARK_CONF_DIR": str(tmp_path / "none")}) == frozenset()
