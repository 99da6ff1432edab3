"""TxExecutor follows Java ThreadPoolExecutor: core first, then queue, then grow, then reject."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from txmsg import ExecutorConfig, LocalTransactionState, RejectedError, RejectionPolicy, TxExecutor

from .conftest import wait_until


class Gate:
    """Tasks that report when they start and block until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started: list[threading.Event] = []
        self.threads: list[str] = []

    def task(self) -> tuple[threading.Event, object]:
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


def make(gate: Gate, **kw: object) -> TxExecutor:
    return TxExecutor(ExecutorConfig(**kw), name="pool")  # type: ignore[arg-type]


def test_grows_past_core_only_when_the_queue_is_full(gate: Gate) -> None:
    ex = make(gate, core_pool_size=2, max_pool_size=4, queue_capacity=2, rejection="abort")
    futures = []
    for _ in range(2):  # core threads first
        started, run = gate.task()
        futures.append(ex.submit(run))
        assert started.wait(10)
    assert ex.stats().pool_size == 2 and ex.stats().queued == 0

    for _ in range(2):  # then the queue, no new thread although max is 4
        _, run = gate.task()
        futures.append(ex.submit(run))
    s = ex.stats()
    assert (s.pool_size, s.queued, s.active) == (2, 2, 2)

    for expected_pool in (3, 4):  # queue full: grow past core, the new task runs at once
        started, run = gate.task()
        futures.append(ex.submit(run))
        assert started.wait(10)
        assert ex.stats().pool_size == expected_pool
    assert ex.stats().queued == 2

    _, run = gate.task()
    with pytest.raises(RejectedError, match="max_pool_size"):
        ex.submit(run)  # max threads busy, queue full

    gate.release.set()
    names = {f.result(10) for f in futures}
    assert len(names) == 4  # four distinct worker threads did the work
    s = ex.stats()
    assert (s.completed, s.rejected, s.largest_pool_size, s.active, s.queued) == (6, 1, 4, 0, 0)
    assert ex.shutdown(timeout=10)
    assert ex.stats().pool_size == 0


def test_threads_above_core_retire_after_keep_alive(gate: Gate) -> None:
    ex = make(gate, core_pool_size=1, max_pool_size=3, queue_capacity=0, keep_alive=0.05)
    futures = []
    for _ in range(3):
        started, run = gate.task()
        futures.append(ex.submit(run))
        assert started.wait(10)
    assert ex.stats().pool_size == 3
    gate.release.set()
    for f in futures:
        f.result(10)
    wait_until(lambda: ex.stats().pool_size <= 1, "non-core threads to retire")
    threading.Event().wait(0.3)  # several keep_alive periods: the core thread must stay
    s = ex.stats()
    assert (s.pool_size, s.largest_pool_size, s.completed) == (1, 3, 3)
    ex.shutdown(timeout=10)


def test_core_threads_stay_and_are_reused(gate: Gate) -> None:
    ex = make(gate, core_pool_size=2, max_pool_size=2, queue_capacity=10, keep_alive=0.01)
    gate.release.set()
    names = {ex.submit(threading.current_thread).result(10).name for _ in range(20)}
    assert ex.stats().pool_size <= 2 and len(names) <= 2
    assert ex.stats().completed == 20
    ex.shutdown(timeout=10)


def test_caller_runs_runs_in_the_submitting_thread(gate: Gate) -> None:
    ex = make(gate, core_pool_size=1, max_pool_size=1, queue_capacity=0, rejection="caller_runs")
    started, run = gate.task()
    busy = ex.submit(run)
    assert started.wait(10)
    result = ex.submit(lambda: threading.current_thread().name).result(0)
    assert result == threading.current_thread().name
    s = ex.stats()
    assert (s.rejected, s.caller_ran) == (1, 1)
    gate.release.set()
    busy.result(10)
    ex.shutdown(timeout=10)


def test_unknow_policy_answers_unknow_without_running(gate: Gate) -> None:
    ex = make(gate, core_pool_size=1, max_pool_size=1, queue_capacity=1, rejection="unknow")
    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    _, queued = gate.task()
    ex.submit(queued)
    ran = threading.Event()
    answer = ex.submit(ran.set)
    assert answer.result(0) is LocalTransactionState.UNKNOW
    assert not ran.is_set()
    assert ex.stats().rejected == 1
    gate.release.set()
    ex.shutdown(timeout=10)
    assert not ran.is_set() and ex.stats().completed == 2


def test_offer_returns_none_when_full_whatever_the_policy(gate: Gate) -> None:
    for policy in RejectionPolicy:
        ex = make(gate, core_pool_size=1, max_pool_size=1, queue_capacity=0, rejection=policy)
        started, run = gate.task()
        ex.submit(run)
        assert started.wait(10)
        assert ex.offer(print) is None
        assert ex.stats().rejected == 1
        ex.shutdown(wait=False)
    gate.release.set()


def test_task_exception_reaches_the_future_and_counts_as_completed() -> None:
    ex = TxExecutor(ExecutorConfig(core_pool_size=1, max_pool_size=1), name="pool")

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        ex.submit(boom).result(10)
    assert ex.submit(lambda: 42).result(10) == 42
    ex.shutdown(timeout=10)
    assert ex.stats().completed == 2


def test_shutdown_runs_queued_tasks_then_refuses_work(gate: Gate) -> None:
    ex = make(gate, core_pool_size=1, max_pool_size=1, queue_capacity=5)
    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    queued = [ex.submit(lambda i=i: i) for i in range(3)]
    ex.shutdown(wait=False)
    with pytest.raises(RejectedError, match="shut down"):
        ex.submit(print)
    gate.release.set()
    assert ex.shutdown(timeout=10)
    assert [f.result(0) for f in queued] == [0, 1, 2]


def test_shutdown_can_cancel_pending(gate: Gate) -> None:
    ex = make(gate, core_pool_size=1, max_pool_size=1, queue_capacity=5)
    started, run = gate.task()
    ex.submit(run)
    assert started.wait(10)
    queued = ex.submit(print)
    assert not ex.shutdown(wait=True, timeout=0.01, cancel_pending=True)  # still busy
    assert queued.cancelled()
    gate.release.set()
    assert ex.shutdown(timeout=10)


def test_zero_core_threads_still_run_queued_work() -> None:
    ex = TxExecutor(ExecutorConfig(core_pool_size=0, max_pool_size=2, queue_capacity=4, keep_alive=0.01), name="pool")
    assert ex.submit(lambda: "done").result(10) == "done"
    wait_until(lambda: ex.stats().pool_size == 0, "the only (non-core) thread to retire")
    ex.shutdown(timeout=10)


def test_default_config_is_not_the_single_thread_pitfall() -> None:
    cfg = ExecutorConfig()
    assert cfg.core_pool_size > 1 and cfg.max_pool_size > cfg.core_pool_size
    assert cfg.queue_capacity < 2000
    assert cfg.rejection is RejectionPolicy.UNKNOW


def test_config_validation_names_the_fix() -> None:
    with pytest.raises(ValidationError, match="core_pool_size .* must be <= max_pool_size"):
        ExecutorConfig(core_pool_size=8, max_pool_size=2)
    with pytest.raises(ValidationError, match="rejection"):
        ExecutorConfig(rejection="drop")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="max_pool_size"):
        ExecutorConfig(max_pool_size=0)
    with pytest.raises(ValidationError, match="queue_size"):
        ExecutorConfig(queue_size=10)  # type: ignore[call-arg]
    assert ExecutorConfig(rejection="caller_runs").rejection is RejectionPolicy.CALLER_RUNS  # type: ignore[arg-type]


def test_thread_names_carry_the_executor_name() -> None:
    ex = TxExecutor(ExecutorConfig(), name="pool-orders")
    assert ex.submit(lambda: threading.current_thread().name).result(10).startswith("pool-orders-")
    ex.shutdown(timeout=10)


@settings(max_examples=25, deadline=None)
@given(
    core=st.integers(1, 3),  # core 0 races the first poll (as in Java); tested separately
    extra=st.integers(0, 3),
    capacity=st.integers(0, 4),
    submits=st.integers(1, 14),
)
def test_matches_the_java_model_while_every_task_blocks(core: int, extra: int, capacity: int, submits: int) -> None:
    """With every thread busy, each submit's outcome is fully determined by Java's rules."""
    maximum = max(1, core + extra)
    release = threading.Event()
    ex = TxExecutor(
        ExecutorConfig(core_pool_size=core, max_pool_size=maximum, queue_capacity=capacity, rejection="abort"),
        name="pool",
    )
    pool = queued = rejected = 0
    try:
        for _ in range(submits):
            try:
                ex.submit(release.wait, 30)
            except RejectedError:
                rejected += 1
            # the model: core threads first, then the queue, then growth to max, then reject
            if pool < core:
                pool += 1
            elif queued < capacity:
                queued += 1
            elif pool < maximum:
                pool += 1
            s = ex.stats()
            assert (s.pool_size, s.queued, s.rejected) == (pool, queued, rejected)
    finally:
        release.set()
        ex.shutdown(timeout=10)
    assert ex.stats().completed == submits - rejected


@pytest.mark.parametrize("spelling", ["CALLER_RUNS", "caller-runs", " caller_runs "])
def test_policy_spellings(spelling: str) -> None:
    assert ExecutorConfig(rejection=spelling).rejection is RejectionPolicy.CALLER_RUNS  # type: ignore[arg-type]
    assert ExecutorConfig(rejection="unknown").rejection is RejectionPolicy.UNKNOW  # type: ignore[arg-type]
