"""Shared fixtures: ONE SparkSession for the whole test session (start-up costs ~10 s)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from txmsg_health import generate, job

from tests.health import cluster

REPO = Path(__file__).resolve().parents[2]
# Logs of a real Apache RocketMQ 4.9.8 broker, kept in the repository (tests/data/README.md says
# where they come from); the tests that read them fail, never skip, when they are missing.
REAL_LOGS = REPO / "tests" / "data" / "real-broker-4.9.8"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    session = job.build_session(
        "local[2]",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.driver.memory": "1g",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    """A Spark standalone cluster on loopback: a master and two workers of one core each, from
    the venv's pyspark (tests/health/cluster.py); one per run: every test under tests/health/ is
    in the xdist group "spark" (conftest.py at the root), so only one worker starts it."""
    with cluster.standalone(tmp_path_factory.mktemp("spark-cluster"), workers=2) as c:
        yield c


@pytest.fixture(autouse=True)
def _short_lived_jvms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every JVM a test here starts (``txmsg health`` in a process of its own) JIT-compiles with
    C1 only (``cluster.SHORT_JIT``: half the CPU of a run of seconds). Function-scoped, so it
    applies after the session's fixtures: the session's own JVM keeps the full JIT."""
    env = cluster.with_short_jit({"JAVA_TOOL_OPTIONS": os.environ.get("JAVA_TOOL_OPTIONS", "")})
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", env["JAVA_TOOL_OPTIONS"])


@pytest.fixture(scope="session")
def real_logs() -> Path:
    if not (REAL_LOGS / "info").is_dir() or not (REAL_LOGS / "debug").is_dir():
        pytest.fail(
            f"real broker logs missing at {REAL_LOGS}: they are tracked in git; "
            "restore them with `git checkout -- tests/data`",
            pytrace=False,
        )
    return REAL_LOGS


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, generate.Manifest]:
    out = tmp_path_factory.mktemp("genlogs") / "logs"
    # two brokers of each kind (-a, -b): planted groups misbehave on -a only
    man = generate.generate(str(out), 120_000, seed=11, layout="brokers", gz=True, replicas=2)
    return out, man


@pytest.fixture(scope="session")
def generated_result(
    spark: object,
    generated: tuple[Path, generate.Manifest],
    tmp_path_factory: pytest.TempPathFactory,
) -> job.JobResult:
    logs, _ = generated
    out = tmp_path_factory.mktemp("genout")
    return job.run(spark, job.JobConfig(inputs=[str(logs)], out=str(out)))  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def artifacts() -> Path:
    p = Path(os.environ.get("TXMSG_ARTIFACTS", "artifacts")).resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test here 600 s instead of the suite's 300 (its JVMs start and JIT-compile on a
    machine the chaos lanes load as well: the lane's first fixture took 164-315 s in fresh-clone
    runs); an explicit ``timeout`` mark wins. The bound is for a hang, not a race with the clock."""
    for item in items:
        if item.nodeid.startswith("tests/health/") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
