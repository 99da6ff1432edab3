"""CheckDispatcher: checks run on the executor, once per transaction key at a time, never raise;
blocking (handle) and non-blocking (submit) callers share that one path."""

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
from txmsg.dispatch import CheckSubmitter
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
    wait_until(
        lambda: d.stats().deduplicated == 3, timeout=10, message="the repeated checks to join"
    )
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
    wait_until(
        lambda: d.stats().deduplicated == 2,
        timeout=10,
        message="the repeated K2 checks to join the queued one",
    )
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
    wait_until(
        lambda: len(slow.calls) == 1,
        timeout=10,
        message="the first check to occupy the only thread",
    )
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
    wait_until(
        lambda: len(slow.calls) == 2, timeout=10, message="the second check to run in the caller"
    )
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


def test_the_default_runs_concurrency_checks_at_once_each_on_its_own_thread(
    slow: SlowCheck,
) -> None:
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
        wait_until(
            lambda: producer.executor.stats().active == 1,
            timeout=10,
            message="the only thread to be busy",
        )
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
    wait_until(
        lambda: d.stats().deduplicated == 1,
        timeout=10,
        message="the next check to join the running one",
    )
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


# ---- the non-blocking entry: submit() (rocketmq5 answers from the future's done-callback) -------


def test_submit_returns_at_once_and_the_check_runs_on_the_executor(slow: SlowCheck) -> None:
    d = make(slow)
    assert isinstance(d, CheckSubmitter)  # what a non-blocking backend looks for
    submission = d.submit(msg("K1"))
    assert submission.joined is False
    assert not submission.future.done()  # the caller did not wait for check_local
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="the check to start")
    assert slow.calls[0][1].startswith("txmsg-test")  # on the executor, not in the caller
    answered_on: list[str] = []
    submission.future.add_done_callback(
        lambda _: answered_on.append(threading.current_thread().name)
    )
    slow.release.set()
    assert submission.future.result(10) is S.COMMIT
    assert answered_on[0].startswith("txmsg-test")  # the done-callback too: no other thread
    wait_until(lambda: d.stats().in_flight == 0, timeout=10, message="the key to be forgotten")
    s = d.stats()
    assert (s.checks, s.deduplicated, s.rejected, s.timed_out) == (1, 0, 0, 0)
    d.executor.shutdown(timeout=10)


def test_submit_of_a_running_key_joins_it(slow: SlowCheck) -> None:
    d = make(slow)
    first = d.submit(msg("K1"))
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="the first check to start")
    again = [d.submit(msg("K1")) for _ in range(3)]
    assert all(s.joined and s.future is first.future for s in again)
    other = d.submit(msg("K2"))  # another key is checked on its own
    assert not other.joined
    slow.release.set()
    assert first.future.result(10) is S.COMMIT
    assert other.future.result(10) is S.COMMIT
    assert sorted(key or "" for key, _ in slow.calls) == ["K1", "K2"]
    s = d.stats()
    assert (s.checks, s.deduplicated) == (5, 3)
    # blocking and non-blocking callers share one path: a handle() of a submitted key joins it
    slow.release.clear()
    pending = d.submit(msg("K3"))
    wait_until(lambda: len(slow.calls) == 3, timeout=10, message="K3 to start")
    answers: list[S] = []
    native = ask(d, msg("K3"), answers)
    wait_until(lambda: d.stats().deduplicated == 4, timeout=10, message="handle() to join")
    slow.release.set()
    native.join(10)
    assert answers == [S.COMMIT]
    assert pending.future.result(10) is S.COMMIT
    assert len(slow.calls) == 3
    d.executor.shutdown(timeout=10)


def test_submit_answers_unknow_for_a_failing_or_odd_check(caplog: pytest.LogCaptureFixture) -> None:
    class Bad:
        def check_local(self, message: Message) -> object:
            if message.transaction_key == "K1":
                raise RuntimeError("db down")
            return "commit, probably"

    d = make(Bad())
    with caplog.at_level(logging.ERROR):
        failing, odd = d.submit(msg("K1")), d.submit(msg("K2"))
        assert failing.future.result(10) is S.UNKNOW  # a state, never the exception
        assert odd.future.result(10) is S.UNKNOW
    assert any("RuntimeError" in r.getMessage() for r in caplog.records)
    d.executor.shutdown(timeout=10)


def test_submit_rejected_by_abort_answers_unknow_at_once(
    slow: SlowCheck, caplog: pytest.LogCaptureFixture
) -> None:
    d = make(slow, concurrency=1, queue_capacity=0, rejection="abort")
    answers: list[S] = []
    busy = fill(d, slow, answers)  # the only thread busy (as async sends would keep it)
    with caplog.at_level(logging.WARNING, logger="txmsg.transaction"):
        refused = d.submit(msg("K2"))
    assert refused.future.done()
    assert refused.future.result() is S.UNKNOW
    assert not refused.joined
    (record,) = [r for r in caplog.records if "K2" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "rejection='abort'" in record.getMessage()
    assert d.stats().rejected == 1
    assert d.stats().in_flight == 1  # K2 is not left behind as "being checked"
    slow.release.set()
    busy.join(10)
    assert answers == [S.COMMIT]
    assert d.submit(msg("K2")).future.result(10) is S.COMMIT  # its slot was given back
    d.executor.shutdown(timeout=10)


def test_submit_never_runs_the_check_in_the_caller_under_caller_runs(
    slow: SlowCheck, caplog: pytest.LogCaptureFixture
) -> None:
    """caller_runs would run check_local in the submitting thread: for submit() that is the
    backend's I/O loop, which must not block, so a full pool answers UNKNOW instead."""
    d = make(slow, concurrency=1, queue_capacity=0, rejection="caller_runs")
    answers: list[S] = []
    busy = fill(d, slow, answers)
    with caplog.at_level(logging.WARNING, logger="txmsg.transaction"):
        refused = d.submit(msg("K2"))  # would block here until release if run inline
    assert refused.future.result(0) is S.UNKNOW
    assert [key for key, _ in slow.calls] == ["K1"]  # check_local of K2 never ran
    assert "I/O thread" in " ".join(r.getMessage() for r in caplog.records)
    assert d.stats().rejected == 1
    assert d.stats().in_flight == 1
    slow.release.set()
    busy.join(10)
    # with room again, the next submit runs normally (on the executor's thread)
    wait_until(lambda: d.executor.stats().active == 0, timeout=10, message="the thread to be idle")
    assert d.submit(msg("K2")).future.result(10) is S.COMMIT
    assert slow.calls[-1][0] == "K2"
    assert slow.calls[-1][1].startswith("txmsg-test")
    d.executor.shutdown(timeout=10)


def test_submit_keeps_a_backlog_without_threads_and_out_of_the_executor_queue(
    slow: SlowCheck,
) -> None:
    """At most ``concurrency`` non-blocking checks are on the executor at once (what the blocking
    entry's native threads allow); the rest wait in the dispatcher, so a backlog of check-backs
    never fills the executor's queue (kept for async sends) and is never rejected for it."""
    d = make(slow, concurrency=2, queue_capacity=0, rejection="abort")
    submissions = [d.submit(msg(f"K{i}")) for i in range(5)]
    wait_until(lambda: len(slow.calls) == 2, timeout=10, message="two checks running")
    s = d.stats()
    assert (s.waiting, s.in_flight, s.rejected) == (3, 5, 0)
    e = d.executor.stats()
    assert (e.threads, e.queued, e.rejected) == (2, 0, 0)
    assert [sub.future.running() for sub in submissions] == [True, True, False, False, False]
    again = d.submit(msg("K4"))  # a waiting key is joined like a running one
    assert again.joined
    assert again.future is submissions[4].future
    slow.release.set()
    assert [sub.future.result(10) for sub in submissions] == [S.COMMIT] * 5
    assert sorted(key or "" for key, _ in slow.calls) == [f"K{i}" for i in range(5)]
    wait_until(lambda: d.stats().in_flight == 0, timeout=10, message="every key forgotten")
    assert d.stats().waiting == 0
    assert d.executor.stats().threads == 2  # never more threads than concurrency
    d.executor.shutdown(timeout=10)


def test_a_check_backlog_lets_queued_async_work_go_first(slow: SlowCheck) -> None:
    """A slot that finished a check hands the next waiting one back to the executor when other
    work (async sends) waits there: the backlog queues behind it instead of holding the thread."""
    d = make(slow, concurrency=1, queue_capacity=8)
    order: list[str] = []
    slow.calls = order  # type: ignore[assignment]  # check_local appends (key, thread) here too
    submissions = [d.submit(msg(f"K{i}")) for i in range(3)]
    wait_until(lambda: len(order) == 1, timeout=10, message="K0 to run")
    send = d.executor.submit(lambda: order.append(("send", threading.current_thread().name)))  # type: ignore[arg-type]
    slow.release.set()
    assert [sub.future.result(10) for sub in submissions] == [S.COMMIT] * 3
    send.result(10)
    assert [what for what, _ in order] == ["K0", "send", "K1", "K2"]
    assert d.executor.stats().threads == 1
    d.executor.shutdown(timeout=10)


def test_a_slot_cancelled_in_the_executor_queue_still_answers(slow: SlowCheck) -> None:
    """Shutdown with cancel_pending drops a slot task still queued behind other work: its check
    and the checks waiting for its slot are answered UNKNOW, nothing is left in flight."""
    d = make(slow, concurrency=1, queue_capacity=8)
    hold = threading.Event()
    blocker = d.executor.submit(hold.wait, 30)  # the only thread busy with other work
    queued = d.submit(msg("K1"))  # its slot task waits in the executor's queue
    waiting = d.submit(msg("K2"))  # waits for the slot
    assert d.stats().waiting == 1
    d.executor.shutdown(wait=False, cancel_pending=True)
    assert queued.future.result(10) is S.UNKNOW
    assert waiting.future.result(10) is S.UNKNOW
    hold.set()
    blocker.result(10)
    assert slow.calls == []
    s = d.stats()
    assert (s.in_flight, s.waiting) == (0, 0)
    d.executor.shutdown(timeout=10)


def test_a_waiting_submission_can_be_cancelled_a_started_one_cannot(slow: SlowCheck) -> None:
    """What a backend's close() relies on: checks not started yet are dropped, started ones are
    waited for."""
    d = make(slow, concurrency=1)
    started = d.submit(msg("K1"))
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="K1 to run")
    waiting = d.submit(msg("K2"))
    assert not started.future.cancel()
    assert waiting.future.cancel()
    assert d.stats().waiting == 0
    assert d.stats().in_flight == 1  # K2 forgotten: its next check starts afresh
    slow.release.set()
    assert started.future.result(10) is S.COMMIT
    assert d.submit(msg("K2")).future.result(10) is S.COMMIT
    assert [key for key, _ in slow.calls] == ["K1", "K2"]  # the cancelled K2 never ran
    d.executor.shutdown(timeout=10)


def test_submit_after_or_during_shutdown_answers_unknow(slow: SlowCheck) -> None:
    d = make(slow, concurrency=1, queue_capacity=4)
    running = d.submit(msg("K1"))
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="K1 to run")
    waiting = d.submit(msg("K2"))
    d.executor.shutdown(wait=False)  # the application closes
    slow.release.set()
    assert running.future.result(10) is S.COMMIT  # a running check still finishes
    assert waiting.future.result(10) is S.UNKNOW  # refused when its slot came: shut down
    assert d.submit(msg("K3")).future.result(0) is S.UNKNOW  # refused at once
    assert d.stats().rejected == 2
    assert [key for key, _ in slow.calls] == ["K1"]
    d.executor.shutdown(timeout=10)


def test_submit_has_no_timeout_a_late_recheck_is_reported(
    slow: SlowCheck, caplog: pytest.LogCaptureFixture
) -> None:
    """Non-blocking: the answer comes when check_local returns, however long it takes; a re-check
    that joins a check older than wait_timeout logs the WARNING and counts timed_out."""
    d = make(slow)
    d.wait_timeout = 0.05
    first = d.submit(msg("K1"))
    wait_until(lambda: len(slow.calls) == 1, timeout=10, message="K1 to run")
    threading.Event().wait(0.2)  # longer than wait_timeout
    assert not first.future.done()  # no UNKNOW sent on the check's behalf
    with caplog.at_level(logging.WARNING, logger="txmsg.transaction"):
        joined = d.submit(msg("K1"))
    assert joined.joined
    assert d.stats().timed_out == 1
    assert any("still unanswered" in r.getMessage() for r in caplog.records)
    slow.release.set()
    assert first.future.result(10) is S.COMMIT
    d.executor.shutdown(timeout=10)


def test_submit_never_raises_and_never_strands_a_key(
    slow: SlowCheck, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = make(slow)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("executor broke")

    monkeypatch.setattr(d.executor, "submit", broken)
    with caplog.at_level(logging.ERROR, logger="txmsg.transaction"):
        submission = d.submit(msg("K1"))
    assert submission.future.result(0) is S.UNKNOW
    assert "check dispatch failed" in caplog.text
    assert d.stats().in_flight == 0  # the next check of K1 is not stuck joining a dead one
    monkeypatch.undo()
    slow.release.set()
    assert d.submit(msg("K1")).future.result(10) is S.COMMIT
    d.executor.shutdown(timeout=10)
