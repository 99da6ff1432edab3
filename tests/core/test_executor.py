"""TxExecutor is a fixed pool of ``concurrency`` threads; submit() alone applies the rejection policy."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txmsg_broker.testing import wait_until

from txmsg import (
    ConfigError,
    ExecutorConfig,
    RejectedError,
    RejectionPolicy,
    TxExecutor,
    TxMsgConfig,
)
from txmsg.executor import ExecutorStats


class Gate:
    """Tasks that report when they start and block until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started: list[threading.Event] = []
        self.threads: list[str] = []

    def task(self) -> tuple[threading.Event, Callable[[], str]]:
        started = threading.Event()
        self.started.append(started)

        def run() -> str:
            self.threads.append(threading.current_thread().name)
            started.set()
            assert self.release.wait(30), "test never released the gate"
            return threading.current_thread().name

        return started, run


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.release.set()


def make(**kw: object) -> TxExecutor:
    return TxExecutor(ExecutorConfig(**kw), name="pool")  # type: ignore[arg-type]


def test_concurrency_tasks_run_at_once_then_queue_then_reject(gate: Gate) -> None:
    ex = make(concurrency=3, queue_capacity=2, rejection="abort")
    futures = []
    for _ in range(3):  # one thread per task up to concurrency: all three run at once
        started, run = gate.task()
        futures.append(ex.submit(run))
        assert started.wait(10)
    s = ex.stats()
    assert (s.threads, s.active, s.queued) == (3, 3, 0)

    for _ in range(2):  # then the queue; no thread beyond concurrency, ever
        _, run = gate.task()
        futures.append(ex.submit(run))
    s = ex.stats()
    assert (s.threads, s.active, s.queued) == (3, 3, 2)

    _, run = gate.task()
    with pytest.raises(RejectedError, match="concurrency"):
        ex.submit(run)  # every thread busy, queue full: abort

    gate.release.set()
    names = {f.result(10) for f in futures}
    assert len(names) == 3
    assert ex.stats() == ExecutorStats(
        threads=3, active=0, queued=0, completed=5, rejected=1, caller_ran=0
    )
    assert ex.shutdown(timeout=10)
    assert ex.stats().threads == 0


def test_threads_start_lazily_and_are_reused() -> None:
    ex = make(concurrency=8)
    names = set()
    for _ in range(20):
        names.add(ex.submit(lambda: threading.current_thread().name).result(10))
        wait_until(lambda: ex.stats().active == 0, timeout=10, message="the thread to go idle")
    # one task at a time never needs a second thread
    assert len(names) == 1
    assert ex.stats().threads == 1
    assert ex.stats().completed == 20
    ex.shutdown(timeout=10)


def test_threads_never_retire_while_the_pool_lives(gate: Gate) -> None:
    ex = make(concurrency=2)
    futures = []
    for _ in range(2):
        started, run = gate.task()
        futures.append(ex.submit(run))
        assert started.wait(10)
    gate.release.set()
    for f in futures:
        f.result(10)
    wait_until(lambda: ex.stats().active == 0, timeout=10, message="both threads to go idle")
    assert ex.stats().threads == 2  # no keep-alive: a fixed pool keeps its threads
    ex.shutdown(timeout=10)


def test_caller_runs_runs_in_the_submitting_thread(gate: Gate) -> None:
    ex = make(concurrency=1, queue_capacity=0, rejection="caller_runs")
    started, run = gate.task()
    busy = ex.submit(run)
    assert started.wait(10)
    future = ex.submit(lambda: threading.current_thread().name)
    assert future.done()
    assert future.result() == threading.current_thread().name
    s = ex.stats()
    assert (s.rejected, s.caller_ran) == (1, 1)
    gate.release.set()
    busy.result(10)
    ex.shutdown(timeout=10)


def test_caller_runs_delivers_the_exception_through_the_future(gate: Gate) -> None:
    ex = make(concurrency=1, queue_capacity=0)  # caller_runs is the default

    def boom() -> None:
        raise ValueError("boom")

    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    with pytest.raises(ValueError, match="boom"):
        ex.submit(boom).result(0)
    gate.release.set()
    ex.shutdown(timeout=10)


def test_abort_does_not_run_the_task(gate: Gate) -> None:
    ex = make(concurrency=1, queue_capacity=1, rejection="abort")
    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    _, queued = gate.task()
    ex.submit(queued)
    ran = threading.Event()
    with pytest.raises(RejectedError, match=r"1 threads busy and 1 tasks queued.*caller_runs"):
        ex.submit(ran.set)
    gate.release.set()
    ex.shutdown(timeout=10)
    assert not ran.is_set()
    assert (ex.stats().completed, ex.stats().rejected) == (2, 1)


def test_task_exception_reaches_the_future_and_counts_as_completed() -> None:
    ex = make(concurrency=1)

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        ex.submit(boom).result(10)
    assert ex.submit(lambda: 42).result(10) == 42
    ex.shutdown(timeout=10)
    assert ex.stats().completed == 2


@pytest.mark.parametrize("policy", list(RejectionPolicy))
def test_shutdown_runs_queued_tasks_then_refuses_work_under_every_policy(
    gate: Gate, policy: RejectionPolicy
) -> None:
    ex = make(concurrency=1, queue_capacity=5, rejection=policy)
    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    queued = [ex.submit(lambda i=i: i) for i in range(3)]
    ex.shutdown(wait=False)
    with pytest.raises(RejectedError, match="shut down"):
        ex.submit(print)  # even caller_runs: the application is closing
    gate.release.set()
    assert ex.shutdown(timeout=10)
    assert [f.result(0) for f in queued] == [0, 1, 2]
    assert ex.stats().caller_ran == 0


def test_shutdown_can_cancel_pending(gate: Gate) -> None:
    ex = make(concurrency=1, queue_capacity=5)
    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    queued = ex.submit(print)
    assert not ex.shutdown(wait=True, timeout=0.01, cancel_pending=True)  # still busy
    assert queued.cancelled()
    gate.release.set()
    assert ex.shutdown(timeout=10)


def test_defaults_say_what_they_do() -> None:
    cfg = ExecutorConfig()
    assert (cfg.concurrency, cfg.queue_capacity, cfg.rejection) == (
        8,
        256,
        RejectionPolicy.CALLER_RUNS,
    )
    assert set(ExecutorConfig.model_fields) == {"concurrency", "queue_capacity", "rejection"}
    assert {p.value for p in RejectionPolicy} == {"abort", "caller_runs"}


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        ExecutorConfig(concurrency=0)
    with pytest.raises(ConfigError, match="concurrency"):
        ExecutorConfig(concurrency=65)  # each unit is a real client instance
    with pytest.raises(ConfigError, match="rejection"):
        ExecutorConfig(rejection="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="queue_size"):
        ExecutorConfig(queue_size=10)  # type: ignore[call-arg]


@pytest.mark.parametrize("spelling", ["CALLER_RUNS", "caller-runs", " caller_runs "])
def test_policy_spellings(spelling: str) -> None:
    assert ExecutorConfig(rejection=spelling).rejection is RejectionPolicy.CALLER_RUNS  # type: ignore[arg-type]


def test_thread_names_carry_the_executor_name() -> None:
    ex = TxExecutor(ExecutorConfig(), name="pool-orders")
    assert ex.submit(lambda: threading.current_thread().name).result(10).startswith("pool-orders-")
    ex.shutdown(timeout=10)


@settings(max_examples=25, deadline=None)
@given(concurrency=st.integers(1, 4), capacity=st.integers(0, 4), submits=st.integers(1, 12))
def test_matches_the_fixed_pool_model_while_every_task_blocks(
    concurrency: int, capacity: int, submits: int
) -> None:
    """With every thread busy, each submit's outcome is fully determined by the fixed-pool rules."""
    release = threading.Event()
    ex = make(concurrency=concurrency, queue_capacity=capacity, rejection="abort")
    threads = queued = rejected = 0
    try:
        for _ in range(submits):
            try:
                ex.submit(release.wait, 30)
            except RejectedError:
                rejected += 1
            # the model: a thread per task up to concurrency, then the queue, then reject
            if threads < concurrency:
                threads += 1
            elif queued < capacity:
                queued += 1
            s = ex.stats()
            assert (s.threads, s.queued, s.rejected) == (threads, queued, rejected)
    finally:
        release.set()
        ex.shutdown(timeout=10)
    assert ex.stats().completed == submits - rejected


def test_model_validate_raises_config_error_as_the_constructor_does() -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        ExecutorConfig.model_validate({"concurrency": 0})
    with pytest.raises(ConfigError, match="concurrency"):
        ExecutorConfig.model_validate_json('{"concurrency": 0}')
    with pytest.raises(ConfigError, match=r"unknown config key 'bogus_key'"):
        TxMsgConfig.model_validate({"bogus_key": 1})
    assert ExecutorConfig.model_validate({"concurrency": 3}).concurrency == 3
