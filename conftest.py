"""The whole suite (tests, samples, docs examples).

* The real client's logs go to a temp dir (not ``~/logs``), also in tests that use librocketmq
  without a broker fixture (the txmsg_broker plugin sets it only for its own fixtures).
* Parallel runs (pytest-xdist, ``-n N``; ``scripts/test.sh`` passes it): every worker gets its own
  PostgreSQL database on the shared test server (:func:`_per_worker_database`), and the
  distribution is grouped (``--dist loadgroup``) by :func:`pytest_collection_modifyitems`.
  Everything else a test touches is its own already: brokers listen on free ports, data and logs
  live under ``tmp_path`` (per worker: ``pytest-of-<user>/pytest-N/popen-gwK``), names come from
  ``txmsg_broker.testing.unique`` (pid + counter + random), PostgreSQL tests use random schemas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

#: tests that share one worker (their xdist group), by node id prefix: a group runs one test at a time
PREFIX_GROUPS = {
    # the Spark health job: one SparkSession per worker (session fixture ``spark``, a JVM of ~1 GiB,
    # ~10 s to start), and the CLI tests start JVMs of their own; two JVMs at once on 2 cores
    # slow each other down several times over
    "tests/health/": "spark",
    # the chaos runs, wall clock by intent (kill -9 and cut-off schedules of 1-3 minutes, 11
    # processes each): two lanes of ~5-6 minutes, so at most two run at once (all five at once
    # overloaded the 2 cores at the start of the run), and each lane is well inside the run's
    # length.  The two on the rocketmq backend take turns (as before), the rocketmq5 run and the
    # outbox kill -9 runs take the other lane.  Each worker has a database of its own
    # (_per_worker_database), so their fixed schemas never meet.
    "tests/chaos/test_chaos_run.py::test_short_chaos_run_keeps_every_service_consistent[rocketmq]": "chaos-remoting",
    "tests/chaos/test_chaos_network.py::": "chaos-remoting",
    "tests/chaos/test_chaos_outbox.py::test_outbox_stream_survives_network_faults": "chaos-remoting",
    "tests/chaos/test_chaos_run.py::test_short_chaos_run_keeps_every_service_consistent[rocketmq5]": "chaos-grpc",
    "tests/chaos/test_chaos_outbox.py::test_outbox_stream_survives_kill_9": "chaos-grpc",
}

#: the xdist group of every other ``wall_clock`` test (real time is the point: the real client's
#: own timers, kill -9 scenarios, a checker racing the broker's real interval): one at a time, so
#: no two of them load the machine together, and dispatched first with the other lanes
WALL_CLOCK_GROUP = "wall-clock"

#: node id prefixes marked ``wall_clock`` here, for files this conftest's owners do not edit (the
#: chaos runs); everywhere else the test itself carries the mark
WALL_CLOCK_PREFIXES = (
    "tests/chaos/test_chaos_run.py::",
    "tests/chaos/test_chaos_network.py::",
    "tests/chaos/test_chaos_outbox.py::",
)

#: measured seconds (setup + call + teardown) per node id, for the dispatch order (:func:`_rank`):
#: the longest work goes out first, so no long test starts late and becomes the run's tail.  A
#: test not listed counts :data:`DEFAULT_SECONDS` (``slow``: :data:`SLOW_SECONDS`).  Refresh it
#: from a full run: ``TXMSG_TEST_DURATIONS=build/test-durations.json`` (scripts/test.sh sets it)
#: writes every test's time there; copy that file here.
DURATIONS_FILE = os.path.join(os.path.dirname(__file__), "tests", "durations.json")
DEFAULT_SECONDS = 0.5
SLOW_SECONDS = 60.0

#: session-scoped fixtures too heavy to start once per worker: the tests that use one run on one
#: worker (xdist group = the fixture's name), which starts it once
HEAVY_SESSION_FIXTURES = ("spark",)

#: the environment variable the PostgreSQL-backed tests read (scripts/pg.sh prints its value)
PG_ENV = "TXMSG_TEST_PG_URL"
#: (admin URL, database) of this worker's database, dropped at the end
_DATABASE = pytest.StashKey[tuple[str, str] | None]()


def _worker() -> str | None:
    """``gw0``, ``gw1``, ... in a pytest-xdist worker; None in a serial run (or the controller)."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def _per_worker_database(worker: str) -> tuple[str, str] | None:
    """Point ``TXMSG_TEST_PG_URL`` of this worker (and the child processes it starts) at a
    database of its own, ``<database>_<worker>``, created empty on the shared server.

    Why: the tests' own fixtures use random schemas, but the chaos runs (``benchmarks.chaos``)
    create fixed schemas (``chaos_orders``, ...) in the database they are given; two of them on
    two workers must not share one.  Returns (admin URL, database) for the drop at the end.
    """
    url = os.environ.get(PG_ENV, "").strip()
    if not url:
        return None
    from sqlalchemy import create_engine, text  # noqa: PLC0415 - only with a PostgreSQL server
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    base = make_url(url)
    name = f"{base.database or 'postgres'}_{worker}"
    engine = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    os.environ[PG_ENV] = base.set(database=name).render_as_string(hide_password=False)
    return url, name


def _drop_database(admin_url: str, name: str) -> None:
    from sqlalchemy import create_engine, text  # noqa: PLC0415

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    # clean-up of a throw-away server: never fail the run for it
    with contextlib.suppress(Exception), engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def pytest_configure(config: pytest.Config) -> None:
    if "ROCKETMQ_CLIENT_LOG_DIR" not in os.environ:
        os.environ["ROCKETMQ_CLIENT_LOG_DIR"] = tempfile.mkdtemp(prefix="rocketmq-client-logs-")
    # the orderly journal's spool files (txmsg.sqla.spool): outside ~/.local/state, and no run
    # finds the spools a killed child of an earlier run left for the same PostgreSQL URL
    if "TXMSG_INFLIGHT_DIR" not in os.environ:
        os.environ["TXMSG_INFLIGHT_DIR"] = tempfile.mkdtemp(prefix="txmsg-inflight-")
    # the health job's class archive (txmsg_health.startup, ~160 MB) is keyed by the checkout's
    # venv: kept in the checkout's build/, a fresh clone's suite does not leave one more in the
    # user's ~/.cache on every run
    if "TXMSG_SPARK_CDS" not in os.environ:
        here = os.path.dirname(os.path.abspath(__file__))
        os.environ["TXMSG_SPARK_CDS"] = os.path.join(here, "build", "spark-cds")
    worker = _worker()
    record = os.environ.get("TXMSG_TEST_DURATIONS", "").strip()
    if record and worker is None:  # the controller sees every report (or the only process)
        config.pluginmanager.register(_DurationRecorder(record), "txmsg-duration-recorder")
    if worker is not None:
        config.stash[_DATABASE] = _per_worker_database(worker)
        config.pluginmanager.register(_GroupSuffix(), "txmsg-xdist-group-suffix")
        timeline = os.environ.get("TXMSG_TEST_TIMELINE", "").strip()
        if timeline:
            config.pluginmanager.register(_Timeline(timeline, worker), "txmsg-timeline")


class _Timeline:
    """``TXMSG_TEST_TIMELINE=PATH``: each worker appends a line when a test starts and ends (S or
    E, worker, wall time, pid, the worker's own CPU seconds, node id), for
    ``scripts/suite_profile.py``: where a run's time goes, lane by lane (docs/guide/testing.md)."""

    def __init__(self, path: str, worker: str) -> None:
        self.path, self.worker = path, worker

    def _line(self, kind: str, nodeid: str) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(
                f"{kind} {self.worker} {time.time():.2f} {os.getpid()} "
                f"{usage.ru_utime + usage.ru_stime:.2f} {nodeid}\n"
            )

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._line("S", nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._line("E", nodeid)


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_DATABASE, None)
    if made is not None:
        _drop_database(*made)


@pytest.fixture(autouse=True)
def _main_thread_event_loop_usable() -> Iterator[None]:
    """After each test, asyncio in this thread is as a fresh process finds it: a loop left set
    but never run is closed (else the next ``asyncio.run()`` or ``set_event_loop`` drops it
    unclosed and its ResourceWarning fails whichever later test the collector runs in), and the
    "no loop, set_event_loop(None) was called" state ``asyncio.run()`` leaves is reset."""
    yield
    # asyncio has no public "is a loop set?"; asking get_event_loop() would make one, which the
    # next asyncio.run() drops unclosed.  So read the default policy's thread state (test-only).
    local = getattr(asyncio.get_event_loop_policy(), "_local", None)
    loop = getattr(local, "_loop", None)
    if loop is not None and not loop.is_running() and not loop.is_closed():
        # a loop this thread got without running it (asyncio.get_event_loop() in the main thread
        # makes one when none is set, e.g. grpc.aio's get_working_loop): the next set_event_loop
        # or asyncio.run() would drop it unclosed and its ResourceWarning fail a later test
        loop.close()
        asyncio.set_event_loop_policy(None)
    elif getattr(local, "_set_called", False) and loop is None:
        asyncio.set_event_loop_policy(None)  # no loop to drop: a fresh policy, as at start


@pytest.fixture(autouse=True)
def _root_log_level_restored() -> Iterator[None]:
    """Each test finds the root logger's level as the run started.  Code run in-process may lower
    it for good (``txmsg demo`` sets INFO to log to its file); in a serial run only later files
    saw that, in a parallel one any test of the worker may (a ``caplog`` test then captures INFO
    records it did not expect)."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


def _group_of(item: pytest.Item) -> str | None:
    """The xdist group an item needs, or None (any worker, alone).

    * its node id in :data:`PREFIX_GROUPS` → that group;
    * marked ``wall_clock`` → :data:`WALL_CLOCK_GROUP`;
    * a heavy session fixture (:data:`HEAVY_SESSION_FIXTURES`) → its name: one worker starts it;
    * a module-scoped fixture (a broker, a wheel build, ...) → the test's file: it is made once.
    """
    for prefix, group in PREFIX_GROUPS.items():
        if item.nodeid.startswith(prefix):
            return group
    if item.get_closest_marker("wall_clock") is not None:
        return WALL_CLOCK_GROUP
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # a doctest or another non-function item
        return None
    for name in HEAVY_SESSION_FIXTURES:
        if name in info.names_closure:
            return name
    for defs in info.name2fixturedefs.values():
        if defs and defs[-1].scope in ("module", "package", "class"):
            return item.nodeid.split("::", 1)[0]
    return None


def _lanes() -> set[str]:
    """The groups that are lanes: dispatched before everything else."""
    return {*PREFIX_GROUPS.values(), WALL_CLOCK_GROUP}


def _expected_seconds(item: pytest.Item, durations: dict[str, float]) -> float:
    known = durations.get(item.nodeid)
    if known is not None:
        return known
    return SLOW_SECONDS if item.get_closest_marker("slow") is not None else DEFAULT_SECONDS


def _load_durations() -> dict[str, float]:
    try:
        with open(DURATIONS_FILE, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def _rank(items: list[pytest.Item]) -> list[pytest.Item]:
    """Dispatch order (:class:`_LongFirst` keeps it): the lanes (Spark, chaos, wall clock) first,
    then every other unit (a group, or a test alone) longest first by :data:`DURATIONS_FILE`
    (longest processing time first: the classic rule that keeps the last worker to finish close
    to the others); ties in collection order.  A group's members stay in collection order."""
    durations = _load_durations()
    lanes = _lanes()
    unit_of: dict[int, str] = {}
    seconds: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        mark = item.get_closest_marker("xdist_group")
        unit = str(mark.args[0]) if mark is not None and mark.args else f"\0{item.nodeid}"
        unit_of[id(item)] = unit
        seconds[unit] = seconds.get(unit, 0.0) + _expected_seconds(item, durations)
        first.setdefault(unit, index)

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, float, int, int]:
        index, item = pair
        unit = unit_of[id(item)]
        return (0 if unit in lanes else 1, -seconds[unit], first[unit], index)

    return [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the chaos runs ``wall_clock`` (:data:`WALL_CLOCK_PREFIXES`); under xdist also give
    every item the group it needs (an explicit ``xdist_group`` mark wins), and put the long ones
    first (:func:`_rank`): a long test that started last would be the run's tail.  Every worker
    collects, and sorts, the same way."""
    for item in items:
        if item.nodeid.startswith(WALL_CLOCK_PREFIXES):
            item.add_marker(pytest.mark.wall_clock)
    if _worker() is None:
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = _group_of(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    items[:] = _rank(items)


class _DurationRecorder:
    """Writes every test's seconds (setup + call + teardown) as JSON to the path in
    ``TXMSG_TEST_DURATIONS`` at the end of the run (the controller, or a serial run), in the form
    of :data:`DURATIONS_FILE`: tests of 1 s and more, rounded to 0.1 s.  A file already there is
    updated (a partial run refreshes its own tests and keeps the others' times)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        if "@" in nodeid.rpartition("]")[2]:  # xdist's "@group" suffix
            nodeid = nodeid.rpartition("@")[0]
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                kept: dict[str, float] = json.load(f)
        except (FileNotFoundError, ValueError):
            kept = {}
        for nodeid, seconds in self.seconds.items():
            kept.pop(nodeid, None)
            if seconds >= 1.0:
                kept[nodeid] = round(seconds, 1)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(kept, f, indent=0, sort_keys=True)
            f.write("\n")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: :class:`_LongFirst` instead of xdist's own ``LoadGroupScheduling``."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]  # noqa: PLC0415

    class _LongFirst(LoadGroupScheduling):  # type: ignore[misc]
        """xdist's loadgroup, with two changes for a suite whose long tests take minutes.

        * Units (a group, or a test alone) go out in collection order, which the workers sorted
          long first (:func:`_rank`), not largest group first: a group of two 2-minute chaos runs
          is not "smaller" than a group of forty 0.1 s tests.
        * A worker can only start a test once it knows the next one, so each gets two units at the
          start; the second comes from the end of the queue (short tests), so no long test waits
          behind another one while a worker elsewhere runs out of work.  Later units come from the
          front as usual, each when its worker has only one test left.
        """

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            config.option.loadscopereorder = False
            super().__init__(config, log)
            self._lookahead_from_the_end = False

        def schedule(self) -> None:
            self._lookahead_from_the_end = self.collection is None  # the first call: initial units
            try:
                super().schedule()
            finally:
                self._lookahead_from_the_end = False

        def _assign_work_unit(self, node: Any) -> None:
            if self._lookahead_from_the_end and self.assigned_work.get(node) and self.workqueue:
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            super()._assign_work_unit(node)

    return _LongFirst(config, log)


class _GroupSuffix:
    """pytest-xdist 3.8's ``--dist loadgroup`` tells the controller a test's group by appending
    ``@<group>`` to its node id, through ``item._nodeid``; pytest 9.2 keeps node ids in
    ``item._id`` instead, so the suffix is lost and every test is scheduled alone, groups ignored
    (pytest-dev/pytest-xdist#1386; the fix, #1388, is not released).  This does what the fix does,
    after xdist's own hook, and nothing once xdist has appended the suffix itself."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not config.getvalue("loadgroup"):
            return
        for item in items:
            names = sorted(
                {
                    str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")
                }
            )
            if not names or "@" in item.nodeid.rpartition("]")[2]:
                continue
            nodeid = f"{item.nodeid}@{'_'.join(names)}"
            if hasattr(item, "_id"):  # pytest >= 9.2: a structured NodeId
                item._id = type(item._id).parse(nodeid)
            else:
                item._nodeid = nodeid  # type: ignore[attr-defined]
