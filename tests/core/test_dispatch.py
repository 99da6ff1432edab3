"""CheckDispatcher: checks run on the executor, once per transaction key at a time, never raise."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from txmsg_broker.testing import wait_until

from txmsg import CheckDispatcher, ExecutorConfig, Message, TxExecutor
from txmsg import LocalTransactionState as S
from txmsg.listener import ListenerSpec
from txmsg.message import UNIQ_KEY


def msg(key: str | None) -> Message:
    return Message(topic="orders", body=b"", properties={UNIQ_KEY: key} if key else {})


class SlowCheck:
    """check_local blocks until released; records which keys it checked on which thread."""

    def __init__(self, answer: S = S.COMMIT) -> None:
        self.answer = answer
        self.release = threading.Event()
        self.calls: list[tuple[str | None, str]] = []
        self.lock = threading.Lock()

    def execute_local(self, message: Message, arg: object) -> S:
        return S.UNKNOW

    def check_local(self, message: Message) -> S:
        with self.lock:
            self.calls.append((message.transaction_key, threading.current_thread().name))
        assert self.release.wait(30)
        return self.answer


def make(listener: object, **cfg: object) -> CheckDispatcher:
    spec = ListenerSpec(group="order-tx", target=type(listener))
    executor = TxExecutor(ExecutorConfig(**cfg), name="txmsg-test")  # type: ignore[arg-type]
    return CheckDispatcher(listener, spec, executor)


@pytest.fixture
def slow() -> Iterator[SlowCheck]:
    listener = SlowCheck()
    yield listener
    listener.release.set()


def ask(dispatcher: CheckDispatcher, message: Message, answers: list[S]) -> threading.Thread:
    t = threading.Thread(target=lambda: answers.append(dispatcher.handle(message)), name="native")
    t.start()
    return t


def test_repeated_check_of_a_running_key_joins_it(slow: SlowCheck) -> None:
    d = make(slow)
    answers: list[S] = []
    threads = [ask(d, msg("K1"), answers)]
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="the first check to start")
    threads += [ask(d, msg("K1"), answers) for _ in range(3)]
    wait_until(lambda: d.stats().deduplicated == 3, timeout=10, message="the repeated checks to join")
    slow.release.set()
    for t in threads:
        t.join(10)
    assert answers == [S.COMMIT] * 4
    assert len(slow.calls) == 1 and slow.calls[0][1].startswith("txmsg-test")
    s = d.stats()
    assert (s.checks, s.deduplicated, s.in_flight) == (4, 3, 0)
    # once finished, the same key is checked afresh
    slow.answer = S.ROLLBACK
    assert d.handle(msg("K1")) is S.ROLLBACK and len(slow.calls) == 2
    d.executor.shutdown(timeout=10)


def test_repeated_check_of_a_queued_key_joins_it_too(slow: SlowCheck) -> None:
    """The broker re-asks while the first check of K2 still waits in the executor's queue: the
    second ask joins the queued check instead of queueing check_local again."""
    d = make(slow, core_pool_size=1, max_pool_size=1, queue_capacity=8)
    answers: list[S] = []
    threads = [ask(d, msg("K1"), answers)]
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="K1 to occupy the only thread")
    threads += [ask(d, msg("K2"), answers)]
    wait_until(lambda: d.stats().in_flight == 2, timeout=10, message="K2 to be queued")
    threads += [ask(d, msg("K2"), answers) for _ in range(2)]
    wait_until(lambda: d.stats().deduplicated == 2, timeout=10, message="the repeated K2 checks to join the queued one")
    slow.release.set()
    for t in threads:
        t.join(10)
    assert answers == [S.COMMIT] * 4
    assert [key for key, _ in slow.calls] == ["K1", "K2"]
    d.executor.shutdown(timeout=10)


def test_different_keys_run_in_parallel(slow: SlowCheck) -> None:
    d = make(slow, core_pool_size=3, max_pool_size=3)
    answers: list[S] = []
    threads = [ask(d, msg(f"K{i}"), answers) for i in range(3)]
    wait_until(lambda: len(slow.calls) == 3, timeout=10, message="three checks running at once")
    assert d.stats().in_flight == 3
    slow.release.set()
    for t in threads:
        t.join(10)
    assert answers == [S.COMMIT] * 3
    d.executor.shutdown(timeout=10)


def test_messages_without_key_are_not_deduplicated(slow: SlowCheck) -> None:
    d = make(slow, core_pool_size=2, max_pool_size=2)
    answers: list[S] = []
    threads = [ask(d, msg(None), answers) for _ in range(2)]
    wait_until(lambda: len(slow.calls) == 2, timeout=10, message="both keyless checks to run")
    slow.release.set()
    for t in threads:
        t.join(10)
    assert d.stats().deduplicated == 0
    d.executor.shutdown(timeout=10)


@pytest.mark.parametrize("policy", ["unknow", "abort"])
def test_saturated_executor_answers_unknow_and_never_raises(slow: SlowCheck, policy: str) -> None:
    d = make(slow, core_pool_size=1, max_pool_size=1, queue_capacity=0, rejection=policy)
    answers: list[S] = []
    busy = ask(d, msg("K1"), answers)
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="the first check to occupy the only thread")
    assert d.handle(msg("K2")) is S.UNKNOW  # rejected, answered at once
    assert d.stats().rejected == 1 and len(slow.calls) == 1
    slow.release.set()
    busy.join(10)
    d.executor.shutdown(timeout=10)


def test_caller_runs_checks_on_the_native_thread(slow: SlowCheck) -> None:
    d = make(slow, core_pool_size=1, max_pool_size=1, queue_capacity=0, rejection="caller_runs")
    answers: list[S] = []
    busy = ask(d, msg("K1"), answers)
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="the pool's only thread to be busy")
    second = ask(d, msg("K2"), answers)
    wait_until(lambda: len(slow.calls) == 2, timeout=10, message="the second check to run in the caller")
    joiner = ask(d, msg("K2"), answers)  # joins the caller-run check
    wait_until(lambda: d.stats().deduplicated == 1, timeout=10, message="the joiner to attach")
    slow.release.set()
    for t in (busy, second, joiner):
        t.join(10)
    assert slow.calls[1] == ("K2", "native")
    assert answers.count(S.COMMIT) == 3 and len(slow.calls) == 2
    assert d.executor.stats().caller_ran == 1
    d.executor.shutdown(timeout=10)


def test_slow_check_answers_unknow_after_the_wait_timeout(slow: SlowCheck) -> None:
    d = make(slow)
    d.wait_timeout = 0.05
    assert d.handle(msg("K1")) is S.UNKNOW  # still running: UNKNOW, the broker asks again
    assert d.stats().timed_out == 1 and d.stats().in_flight == 1
    answers: list[S] = []
    again = ask(d, msg("K1"), answers)
    wait_until(lambda: d.stats().deduplicated == 1, timeout=10, message="the next check to join the running one")
    slow.release.set()
    again.join(10)
    assert len(slow.calls) == 1
    d.executor.shutdown(timeout=10)


def test_failing_and_odd_checks_answer_unknow() -> None:
    class Bad:
        def check_local(self, message: Message) -> object:
            raise RuntimeError("db down")

    d = make(Bad())
    assert d.handle(msg("K1")) is S.UNKNOW
    d.executor.shutdown(timeout=10)
    assert d.handle(msg("K2")) is S.UNKNOW  # executor shut down: still no exception
    assert d.handle(None) is S.UNKNOW  # type: ignore[arg-type]


def test_check_concurrency_is_the_executor_maximum() -> None:
    d = make(SlowCheck(), core_pool_size=2, max_pool_size=12)
    assert d.check_concurrency == 12
    d.executor.shutdown(timeout=10)


def test_a_key_is_never_checked_twice_at_once_under_load() -> None:
    """Invariant under many native threads and few keys: per key, at most one check_local runs."""

    class Counting:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.running: dict[str, int] = {}
            self.worst = 0
            self.calls = 0

        def check_local(self, message: Message) -> S:
            key = message.transaction_key or ""
            with self.lock:
                self.running[key] = self.running.get(key, 0) + 1
                self.worst = max(self.worst, self.running[key])
                self.calls += 1
            threading.Event().wait(0.002)  # give other threads a chance to collide
            with self.lock:
                self.running[key] -= 1
            return S.ROLLBACK

    listener = Counting()
    d = make(listener, core_pool_size=4, max_pool_size=8, queue_capacity=16, rejection="caller_runs")
    answers: list[S] = []
    start = threading.Barrier(10)

    def native(n: int) -> None:
        start.wait()
        for i in range(20):
            answers.append(d.handle(msg(f"K{(n + i) % 5}")))

    threads = [threading.Thread(target=native, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 200 and set(answers) == {S.ROLLBACK}
    assert listener.worst == 1
    s = d.stats()
    assert s.checks == 200 and listener.calls + s.deduplicated == 200 and s.in_flight == 0
    d.executor.shutdown(timeout=10)
