"""Which settings the health job gives Spark's session builder (``job.build_session``).

JVM options are the job's only for a driver JVM it launches itself in local mode: on a cluster
the executors' and the driver's JVMs are the cluster's (its spark-defaults.conf, spark-submit's
``--conf``), and any value the user set stays. The same holds for every other default the job
sets (shuffle partitions, the UI, ...): it yields to a value the user set; only the session time
zone is the job's. No JVM is started here: the builder and the running JVM are fakes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyspark
import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from txmsg_health import job, loopback, sizing

DRIVER = "spark.driver.extraJavaOptions"
EXECUTOR = "spark.executor.extraJavaOptions"
CLUSTERS = ["spark://host:7077", "yarn", "k8s://https://host:443", "local-cluster[2,1,1024]"]
LOCALS = ["local", "local[2]", "local[*]"]
TZ = "spark.sql.session.timeZone"
SHUFFLE = "spark.sql.shuffle.partitions"
UI = "spark.ui.enabled"


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
    # a JVM that runs already (tests that say so) has no configuration of its own unless they give it
    monkeypatch.setattr(job, "running_spark_keys", lambda: frozenset(), raising=False)
    return fake


def _defaults(master: str) -> dict[str, str]:
    """The job's own defaults for a session that launches the JVM on ``master``: no user values."""
    return {k: v for k, v in job.session_settings(master).items() if k != TZ}


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


def test_spark_defaults_value_is_kept(
    builder: _Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit (which launches the JVM) applies spark-defaults.conf unless the job overrides it."""
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "# site settings\n\nspark.master  local[4]\nspark.driver.extraJavaOptions   -XX:+UseG1GC -Dsite=1\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    job.build_session("local[2]", fast_start=True)
    assert DRIVER not in builder.options


def test_properties_file_of_pyspark_submit_args_is_kept(
    builder: _Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    builder: _Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
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
        "# comment\n! comment\n  spark.a   1 2\nspark.b=x\nspark.c:y\nspark.d\n"
    )
    keys = job.user_spark_keys({"SPARK_CONF_DIR": str(tmp_path)})
    assert {"spark.a", "spark.b", "spark.c", "spark.d"} <= keys
    assert not {"#", "!", "comment", "1", "2"} & keys
    submit = job.user_spark_keys(
        {
            "SPARK_CONF_DIR": str(tmp_path / "none"),
            "PYSPARK_SUBMIT_ARGS": "--conf spark.x=1 --conf=spark.y=2 --driver-java-options -Dz "
            "pyspark-shell",
        }
    )
    assert submit == {"spark.x", "spark.y", DRIVER}
    assert job.user_spark_keys({"SPARK_CONF_DIR": str(tmp_path / "none")}) == frozenset()


@pytest.mark.parametrize("master", LOCALS + CLUSTERS)
def test_every_default_yields_to_spark_defaults_conf(
    builder: _Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, master: str
) -> None:
    """Each key the job would set, set instead in spark-defaults.conf: the job leaves it out."""
    defaults = _defaults(master)
    assert {SHUFFLE, UI} <= defaults.keys()
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k}  user-{i}\n" for i, k in enumerate(defaults))
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    job.build_session(master)
    assert not defaults.keys() & builder.options.keys()
    assert builder.options[TZ] == "UTC"


def test_defaults_yield_to_pyspark_submit_args(
    builder: _Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    props = tmp_path / "my.conf"
    props.write_text("spark.sql.adaptive.enabled=true\n")
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS",
        f"--conf {SHUFFLE}=64 --conf={UI}=true --properties-file {props} pyspark-shell",
    )
    job.build_session("local[2]")
    assert SHUFFLE not in builder.options
    assert UI not in builder.options
    assert "spark.sql.adaptive.enabled" not in builder.options
    assert (
        builder.options["spark.ui.showConsoleProgress"] == "false"
    )  # not set by the user: the job's


@pytest.mark.parametrize("master", [None, "local[2]", *CLUSTERS])
def test_defaults_yield_to_spark_submit_conf(
    builder: _Builder, monkeypatch: pytest.MonkeyPatch, master: str | None
) -> None:
    """spark-submit --conf k=v (or its spark-defaults.conf): the JVM runs with them; the job keeps them."""
    monkeypatch.setattr(loopback, "jvm_running", lambda: True)
    monkeypatch.setattr(loopback, "session_conf", lambda master, conf: {})
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setattr(
        job,
        "running_spark_keys",
        lambda: frozenset({SHUFFLE, UI, "spark.sql.files.maxPartitionBytes"}),
        raising=False,
    )
    job.build_session(master)
    assert not {SHUFFLE, UI, "spark.sql.files.maxPartitionBytes"} & builder.options.keys()
    assert sizing.SIZED not in builder.options  # both sizing keys are the user's: none sized
    assert builder.options["spark.python.sql.dataFrameDebugging.enabled"] == "false"
    assert builder.options[TZ] == "UTC"


def test_conf_beats_defaults_and_user_set(builder: _Builder) -> None:
    """The job's own --conf is the user's too: its value goes to the builder, over spark-defaults."""
    job.build_session("spark://host:7077", {SHUFFLE: "400"})
    assert builder.options[SHUFFLE] == "400"


@pytest.mark.parametrize("master", LOCALS + CLUSTERS)
def test_one_rule_for_every_default(master: str) -> None:
    """session_settings: any one default the user set is left out, and nothing else changes."""
    defaults = _defaults(master)
    for key in defaults:
        s = job.session_settings(master, user_set={key})
        assert key not in s
        # sizing.SIZED lists the sizing keys the job owns: a user's one leaves that list too
        sized = [k for k in defaults.get(sizing.SIZED, "").split(",") if k and k != key]
        others = {k: v for k, v in defaults.items() if k not in (key, sizing.SIZED)}
        expected = {**others, **({sizing.SIZED: ",".join(sized)} if sized else {})}
        if key == sizing.SIZED:
            expected.pop(sizing.SIZED, None)
        assert s == {**expected, TZ: "UTC"}
        assert job.session_settings(master, {key: "mine"}, user_set={key})[key] == "mine"
    assert job.session_settings(master, user_set=set(defaults)) == {TZ: "UTC"}
    assert job.REQUIRED_SETTINGS == {TZ: "UTC"}


def test_session_time_zone_is_the_jobs() -> None:
    """Not a default: window_start is computed in UTC; another zone would shift every window."""
    for master in ["local[2]", *CLUSTERS]:
        assert job.session_settings(master, user_set={TZ})[TZ] == "UTC"
        assert job.session_settings(master, {TZ: "Asia/Shanghai"})[TZ] == "UTC"


class _Conf:
    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def getAll(self) -> list[tuple[str, str]]:
        return [(k, "v") for k in sorted(self.keys)]


class _Context:
    def __init__(self, keys: set[str]) -> None:
        self.conf = _Conf(keys)

    def getConf(self) -> _Conf:
        return self.conf


def test_running_spark_keys_of_an_active_context(monkeypatch: pytest.MonkeyPatch) -> None:
    context = _Context({"spark.master", SHUFFLE})

    class _Session:
        sparkContext = context

        conf = SimpleNamespace(getAll={UI: "true"})  # RuntimeConfig.getAll: a property (pyspark 4)

    monkeypatch.setattr(SparkContext, "_active_spark_context", context)
    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)
    assert job.running_spark_keys({}) == {"spark.master", SHUFFLE}
    monkeypatch.setattr(SparkSession, "_instantiatedSession", _Session())
    assert job.running_spark_keys({}) == {"spark.master", SHUFFLE, UI}


def test_running_spark_keys_of_spark_submits_jvm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setattr(SparkContext, "_ensure_initialized", classmethod(lambda cls: None))
    monkeypatch.setattr(pyspark, "SparkConf", lambda: _Conf({SHUFFLE, "spark.master"}))
    env = {"PYSPARK_GATEWAY_PORT": "1", "SPARK_CONF_DIR": str(tmp_path / "none")}
    assert job.running_spark_keys(env) == {SHUFFLE, "spark.master"}
    # a JVM this process launched for a session since stopped: what the user set for that launch
    env = {"SPARK_CONF_DIR": str(tmp_path / "none"), "PYSPARK_SUBMIT_ARGS": f"--conf {UI}=1 x"}
    assert job.running_spark_keys(env) == {UI}
