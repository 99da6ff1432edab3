"""CheckDispatcher: checks run on the executor, once per transaction key at a time, never raise."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from txmsg_broker.testing import wait_until

from txmsg import (
    CheckDispatcher,
    ExecutorConfig,
    Message,
    RejectedError,
    RejectionPolicy,
    TxExecutor,
)
from txmsg import LocalTransactionState as S
from txmsg.listener import ListenerSpec
from txmsg.message import UNIQ_KEY
from txmsg.producer import TransactionalProducer

from .doubles import DoubleBackend


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
    assert len(slow.calls) == 1
    assert slow.calls[0][1].startswith("txmsg-test")
    s = d.stats()
    assert (s.checks, s.deduplicated, s.in_flight) == (4, 3, 0)
    # once finished, the same key is checked afresh
    slow.answer = S.ROLLBACK
    assert d.handle(msg("K1")) is S.ROLLBACK
    assert len(slow.calls) == 2
    d.executor.shutdown(timeout=10)


def test_repeated_check_of_a_queued_key_joins_it_too(slow: SlowCheck) -> None:
    """The broker re-asks while the first check of K2 still waits in the executor's queue: the
    second ask joins the queued check instead of queueing check_local again."""
    d = make(slow, concurrency=1, queue_capacity=8)
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
    d = make(slow, concurrency=3)
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
    d = make(slow, concurrency=2)
    answers: list[S] = []
    threads = [ask(d, msg(None), answers) for _ in range(2)]
    wait_until(lambda: len(slow.calls) == 2, timeout=10, message="both keyless checks to run")
    slow.release.set()
    for t in threads:
        t.join(10)
    assert d.stats().deduplicated == 0
    d.executor.shutdown(timeout=10)


def fill(d: CheckDispatcher, slow: SlowCheck, answers: list[S]) -> threading.Thread:
    """Occupy the executor's only thread (concurrency=1, queue_capacity=0) with a check of K1."""
    busy = ask(d, msg("K1"), answers)
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="the first check to occupy the only thread")
    return busy


def test_abort_on_a_full_pool_answers_unknow_with_a_warning(
    slow: SlowCheck, caplog: pytest.LogCaptureFixture
) -> None:
    d = make(slow, concurrency=1, queue_capacity=0, rejection="abort")
    answers: list[S] = []
    busy = fill(d, slow, answers)
    with caplog.at_level(logging.WARNING, logger="txmsg.transaction"):
        assert d.handle(msg("K2")) is S.UNKNOW  # refused by submit(), answered at once
    assert len(slow.calls) == 1  # check_local of K2 never ran
    (record,) = [r for r in caplog.records if "K2" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "answering UNKNOW" in record.getMessage()
    assert "rejection='abort'" in record.getMessage()
    assert d.stats().rejected == 1
    assert d.executor.stats().rejected == 1
    assert d.stats().in_flight == 1  # K2 is not left behind as "being checked"
    slow.release.set()
    busy.join(10)
    d.executor.shutdown(timeout=10)


def test_caller_runs_checks_on_the_native_thread(slow: SlowCheck) -> None:
    d = make(slow, concurrency=1, queue_capacity=0, rejection="caller_runs")
    answers: list[S] = []
    busy = fill(d, slow, answers)
    second = ask(d, msg("K2"), answers)
    wait_until(lambda: len(slow.calls) == 2, timeout=10, message="the second check to run in the caller")
    joiner = ask(d, msg("K2"), answers)  # joins the caller-run check
    wait_until(lambda: d.stats().deduplicated == 1, timeout=10, message="the joiner to attach")
    slow.release.set()
    for t in (busy, second, joiner):
        t.join(10)
    assert slow.calls[1] == ("K2", "native")
    assert answers.count(S.COMMIT) == 3
    assert len(slow.calls) == 2
    assert d.executor.stats().caller_ran == 1
    assert d.stats().rejected == 0  # nothing answered UNKNOW: caller_runs ran the check
    d.executor.shutdown(timeout=10)


def test_the_default_runs_concurrency_checks_at_once_each_on_its_own_thread(slow: SlowCheck) -> None:
    """Default ExecutorConfig: the backend is asked for 8 instances and 8 checks run at once
    (the old default asked for 16 instances and ran 8)."""
    d = make(slow)
    assert d.check_concurrency == ExecutorConfig().concurrency == 8
    answers: list[S] = []
    threads = [ask(d, msg(f"K{i}"), answers) for i in range(8)]
    wait_until(lambda: len(slow.calls) == 8, timeout=10, message="eight checks running at once")
    assert len({thread for _, thread in slow.calls}) == 8
    s = d.executor.stats()
    assert (s.threads, s.active, s.queued, s.rejected, s.caller_ran) == (8, 8, 0, 0, 0)
    slow.release.set()
    for t in threads:
        t.join(10)
    assert answers == [S.COMMIT] * 8
    d.executor.shutdown(timeout=10)


class BlockingExecute(SlowCheck):
    """execute_local of the body b"block" waits for ``hold``: an async send occupies a thread."""

    def __init__(self) -> None:
        super().__init__(answer=S.ROLLBACK)
        self.release.set()  # check_local answers at once
        self.hold = threading.Event()

    def execute_local(self, message: Message, arg: object) -> S:
        if message.body == b"block":
            assert self.hold.wait(30)
        return S.COMMIT


@pytest.mark.parametrize("policy", list(RejectionPolicy))
def test_a_full_pool_treats_checks_and_async_sends_alike(policy: RejectionPolicy) -> None:
    """One policy, applied in one place (TxExecutor.submit), for both kinds of work."""
    listener = BlockingExecute()
    spec = ListenerSpec(group="order-tx", target=BlockingExecute)
    config = ExecutorConfig(concurrency=1, queue_capacity=0, rejection=policy)
    producer = TransactionalProducer.create(DoubleBackend(), spec, listener, config)
    try:
        busy = producer.send_in_transaction_async("orders", b"block")  # the only thread waits
        wait_until(lambda: producer.executor.stats().active == 1, timeout=10, message="the only thread to be busy")
        here = threading.current_thread().name
        if policy is RejectionPolicy.ABORT:
            with pytest.raises(RejectedError, match="rejection='abort'"):
                producer.send_in_transaction_async("orders", b"b")
            assert producer.dispatcher.handle(msg("K9")) is S.UNKNOW
            assert listener.calls == []  # check_local never ran
            assert producer.stats().sent == 0  # and nothing but the blocked send was started
        else:
            result = producer.send_in_transaction_async("orders", b"b")
            assert result.done()
            assert result.result().local_state is S.COMMIT
            assert producer.dispatcher.handle(msg("K9")) is S.ROLLBACK
            assert listener.calls == [("K9", here)]  # both ran in the submitting thread
        s = producer.executor.stats()
        assert (s.rejected, s.caller_ran) == (2, 0 if policy is RejectionPolicy.ABORT else 2)
        listener.hold.set()
        assert busy.result(10).local_state is S.COMMIT
    finally:
        listener.hold.set()
        producer.close(timeout=10)


def test_slow_check_answers_unknow_after_the_wait_timeout(slow: SlowCheck) -> None:
    d = make(slow)
    d.wait_timeout = 0.05
    assert d.handle(msg("K1")) is S.UNKNOW  # still running: UNKNOW, the broker asks again
    assert d.stats().timed_out == 1
    assert d.stats().in_flight == 1
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


def test_check_concurrency_is_the_configured_concurrency() -> None:
    d = make(SlowCheck(), concurrency=12)
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
    d = make(listener, concurrency=8, queue_capacity=16, rejection="caller_runs")
    answers: list[S] = []
    start = threading.Barrier(10)

    def native(n: int) -> None:
        start.wait()
        answers.extend(d.handle(msg(f"K{(n + i) % 5}")) for i in range(20))

    threads = [threading.Thread(target=native, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 200
    assert set(answers) == {S.ROLLBACK}
    assert listener.worst == 1
    s = d.stats()
    assert s.checks == 200
    assert listener.calls + s.deduplicated == 200
    assert s.in_flight == 0
    d.executor.shutdown(timeout=10)
