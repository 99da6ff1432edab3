"""Check-backs: from a backend's thread to the listener's executor and back.

Backends receive check-backs in two ways, so the dispatcher has two entries onto one path:

* blocking, :meth:`CheckDispatcher.handle`: the C++ client (librocketmq) delivers all check-backs
  of one client instance on one native thread, which must *return* the answer; it waits for it.
* non-blocking, :meth:`CheckDispatcher.submit`: returns at once with a future of the answer.  The
  5.x gRPC client receives a check on its I/O loop, which must not block, and the answer is an RPC
  of its own (``EndTransaction``) that the backend sends from the future's done-callback.  No
  thread waits for a check, so a group's checks occupy the listener's executor threads and nothing
  else: ``concurrency`` threads, not a backend pool of the same size blocked on them.  At most
  ``concurrency`` of these checks are on the executor at once (the bound the blocking entry gets
  from its native threads); a backlog waits in the dispatcher, without threads, so check-backs
  never fill the executor's queue, which stays for async sends.  A check still waiting may be
  cancelled (``future.cancel()``: a backend closing); a started one runs to its answer.

Either way the dispatcher (1) runs ``check_local`` on the listener's
:class:`~txmsg.executor.TxExecutor` (so checks of one group run in parallel), (2) runs a check for
a transaction key at most once at a time: a repeated check of the same key joins the queued or
running one and gets its answer (``submit`` says so, ``joined``, so a backend answers the broker
once per ``check_local`` run), and (3) never raises into the backend.

The dispatcher answers UNKNOW without an answer from ``check_local`` in exactly these cases (UNKNOW
means "no answer yet": the broker asks again at its next check interval):

a. ``check_local`` raised or returned something that is not a ``LocalTransactionState``;
b. blocking entry only: it outlived ``wait_timeout`` (``check_wait_timeout`` in the config); it
   keeps running and the broker's next check of that transaction joins it.  The non-blocking entry
   has no timeout: its future is answered when ``check_local`` returns.  No thread waits that a
   timeout would free, and an early UNKNOW would tell the broker only what a missing answer tells
   it (ask again), while the broker's re-checks join the running check.  A re-check that finds the
   check running for longer than ``wait_timeout`` is logged (WARNING) and counted ``timed_out``;
c. the executor refused the check: ``rejection='abort'`` and every thread busy with a full
   queue (only possible when async sends fill the pool; see :mod:`txmsg.executor`).  For the
   non-blocking entry ``caller_runs`` refuses too: its caller is the backend's I/O thread, which
   must not run ``check_local``;
d. the executor is shut down (the application is closing).

(b), (c) and (d) log a WARNING on ``txmsg.transaction``; (a) logs an ERROR.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from txmsg.defaults import CHECK_WAIT_TIMEOUT
from txmsg.errors import RejectedError
from txmsg.executor import TxExecutor
from txmsg.listener import ListenerSpec
from txmsg.message import Message
from txmsg.otel.hooks import CheckTelemetry
from txmsg.safety import run_check_local
from txmsg.states import LocalTransactionState

if TYPE_CHECKING:
    from txmsg.aio.loop import LoopBridge

log = logging.getLogger("txmsg.transaction")

UNKNOW = LocalTransactionState.UNKNOW


@dataclass(frozen=True)
class DispatchStats:
    """Counters of one dispatcher."""

    checks: int
    """Check-backs received (both entries)."""
    deduplicated: int
    """Check-backs answered by joining a queued or running check of the same transaction key."""
    rejected: int
    """Check-backs the executor refused (``rejection='abort'`` with a full pool, or shut down), and
    non-blocking ones a full pool would have run on the backend's I/O thread (``caller_runs``):
    answered UNKNOW.  Under ``caller_runs`` a full pool runs a blocking check on the native
    thread instead (counted in the executor's ``caller_ran``)."""
    timed_out: int
    """Blocking check-backs answered UNKNOW because check_local took longer than ``wait_timeout``,
    and non-blocking ones that joined a check already running for longer than that."""
    in_flight: int
    """Transaction keys being checked right now (waiting ones included)."""
    waiting: int = 0
    """Non-blocking checks waiting for a free slot.  Why slots: at most ``concurrency`` of them
    are on the executor at once (as many as the blocking entry's native threads could hand in),
    so a backlog of check-backs waits here, without threads, instead of filling the executor's
    queue, which stays for async sends."""


class CheckSubmission(NamedTuple):
    """What :meth:`CheckDispatcher.submit` returns."""

    future: Future[LocalTransactionState]
    """Completes with the answer (always a ``LocalTransactionState``, never an exception);
    done-callbacks run on the executor thread that ran ``check_local`` (or at once, in the
    submitting thread, when the answer is already known: refused, or a finished join).  While the
    check waits for a free slot (``future.running()`` is False) the backend may ``cancel()`` it
    (closing: it never runs, the key is forgotten); a started check cannot be cancelled."""
    joined: bool
    """True when a check of the same transaction key was already queued or running: ``future`` is
    that check's answer, which the backend answers (or answered) already.  Why a backend needs
    it: one ``check_local`` run should be answered once; a second COMMIT of a transaction the
    first one resolved is at best refused by the broker."""


@runtime_checkable
class CheckSubmitter(Protocol):
    """A check handler with the non-blocking entry (:class:`CheckDispatcher` is one).

    A backend whose client must not block (rocketmq5) looks for it on the ``check_handler`` it is
    given; a bare handler without it has no executor, so the backend must provide threads."""

    def submit(self, message: Message) -> CheckSubmission:
        """Start (or join) the check of ``message``; returns at once, never raises."""
        ...


class _InFlight(NamedTuple):
    future: Future[LocalTransactionState]
    started: float  # time.monotonic() of the submission


class _Waiting(NamedTuple):
    message: Message
    key: str | None
    answer: Future[LocalTransactionState]


class _NotHere:
    """What a non-blocking check returns when ``caller_runs`` ran it in the submitting thread."""


_NOT_HERE = _NotHere()


class CheckDispatcher:
    """Turns a backend's check-back into one ``check_local`` call on the listener's executor.

    Parameters:
        listener: the listener instance (has ``check_local(message)``).
        spec: its :class:`~txmsg.listener.ListenerSpec` (group, for logs).
        executor: the listener's executor; :meth:`~txmsg.executor.TxExecutor.submit` applies
            its rejection policy.
        wait_timeout: seconds a blocking caller (:meth:`handle`) waits for an answer before
            replying UNKNOW (the check keeps running; the broker will ask again and join it).
        bridge: the app's event loop, for an ``async def check_local``.

    Backends receive the dispatcher itself as their ``check_handler``: calling it is
    :meth:`handle`; a backend that must not block uses :meth:`submit` (see :class:`CheckSubmitter`).
    """

    def __init__(
        self,
        listener: Any,
        spec: ListenerSpec,
        executor: TxExecutor,
        *,
        wait_timeout: float = CHECK_WAIT_TIMEOUT,
        bridge: LoopBridge | None = None,
    ) -> None:
        self.listener = listener
        self.spec = spec
        self.executor = executor
        self.wait_timeout = wait_timeout
        self.bridge = bridge
        """The event loop an ``async def check_local`` runs on (the executor thread waits for
        it, so ``concurrency`` still bounds the checks running at once)."""
        self._lock = threading.RLock()  # RLock: done-callbacks may run inline under it
        self._in_flight: dict[str, _InFlight] = {}
        self._submitting = threading.local()  # set while submit() hands a check to the executor
        self._started = 0  # non-blocking checks on the executor (slots taken)
        self._waiting: deque[_Waiting] = deque()
        self._checks = 0
        self._deduplicated = 0
        self._rejected = 0
        self._timed_out = 0
        self._telemetry = CheckTelemetry(spec.group)  # `check <topic>` spans, txmsg.checks

    @property
    def check_concurrency(self) -> int:
        """How many checks this group can run at once: what the backend should provision."""
        return self.executor.config.concurrency

    def handle(self, message: Message) -> LocalTransactionState:
        """Answer one check-back, blocking for at most ``wait_timeout``; never raises.

        For backends whose thread must return the answer (librocketmq's native check thread)."""
        started = self._telemetry.started()
        key: str | None = None
        try:
            key = _key(message)
            submission = self._submit(message, key, blocking=True)
            state = self._wait(submission.future, key)
        except BaseException as exc:  # noqa: BLE001 - logged by _dispatch_failed; never raise into a backend
            self._dispatch_failed(key, exc)
            state = UNKNOW
        self._telemetry.answered(message, state, started)
        return state

    __call__ = handle

    def submit(self, message: Message) -> CheckSubmission:
        """Start the check of ``message`` (or join the one running for its key) and return at
        once; never raises, never runs ``check_local`` in the calling thread.

        For backends that answer the broker asynchronously (rocketmq5: its I/O loop must not
        block).  The future has no timeout (module docstring, case b)."""
        started = self._telemetry.started()
        key: str | None = None
        try:
            key = _key(message)
            submission = self._submit(message, key, blocking=False)
        except BaseException as exc:  # noqa: BLE001 - logged by _dispatch_failed; never raise into a backend
            self._dispatch_failed(key, exc)
            submission = CheckSubmission(_answered(UNKNOW), joined=False)
        if self._telemetry.enabled:
            telemetry = self._telemetry
            submission.future.add_done_callback(
                lambda done: telemetry.answered(message, _state_of(done), started)
            )
        return submission

    def _dispatch_failed(self, key: str | None, exc: BaseException) -> None:
        log.error(
            "group=%s key=%s: check dispatch failed: %s: %s; answering UNKNOW",
            self.spec.group,
            key,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )

    def _submit(self, message: Message, key: str | None, *, blocking: bool) -> CheckSubmission:
        answer: Future[LocalTransactionState] = Future()
        start = True
        with self._lock:
            self._checks += 1
            running = self._in_flight.get(key) if key else None
            if running is not None:
                self._deduplicated += 1
            else:
                if key:
                    self._track(key, answer)  # before submit: caller_runs may run it right here
                if not blocking:
                    if self._started < self.check_concurrency:
                        self._started += 1  # a slot: released by _take_next
                        answer.set_running_or_notify_cancel()  # new: always True
                    else:
                        self._waiting.append(_Waiting(message, key, answer))
                        start = False
        if running is not None:
            log.debug("group=%s key=%s: check already running; joining it", self.spec.group, key)
            if not blocking:
                self._note_overdue(running, key)
            return CheckSubmission(running.future, joined=True)
        if blocking:
            self._start_blocking(message, key, answer)
        elif start:
            self._launch(_Waiting(message, key, answer))
        return CheckSubmission(answer, joined=False)

    def _start_blocking(
        self, message: Message, key: str | None, answer: Future[LocalTransactionState]
    ) -> None:
        answer.set_running_or_notify_cancel()  # new: always True; nobody may cancel it now
        try:
            submitted = self.executor.submit(self._run_check, message)
        except RejectedError as exc:
            self._refused(answer, key, str(exc))
            return
        except BaseException:
            answer.set_result(UNKNOW)  # never leave joiners (and the key) hanging
            raise
        submitted.add_done_callback(lambda done: answer.set_result(_state_of(done)))

    # ---- non-blocking checks: at most check_concurrency slots on the executor -----------------
    #
    # A slot is one executor task (_run_slot) that runs its check, answers it (the backend's
    # done-callbacks run there), then takes the next waiting check, in the same thread: a check
    # that finishes cannot give its slot to the executor queue from inside its task (the
    # executor still counts the thread busy, so with queue_capacity=0 the hand-over would be
    # refused).  When other work (async sends) waits in the executor's queue, the slot hands its
    # next check back to the executor instead, behind that work, as a check handed in by a
    # native thread would queue.

    def _launch(self, item: _Waiting) -> None:
        """From the backend's thread, with a slot taken for ``item`` (running): start it on the
        executor; when refused, answer UNKNOW and pass the slot on (never raises)."""
        current: _Waiting | None = item
        while current is not None:
            try:
                self._to_executor(current)
                return
            except RejectedError as exc:
                self._refused(current.answer, current.key, str(exc))
            except BaseException as exc:  # noqa: BLE001 - logged by _dispatch_failed; never raise into a backend
                self._dispatch_failed(current.key, exc)
                current.answer.set_result(UNKNOW)  # never leave joiners (and the key) hanging
            current = self._take_next()

    def _to_executor(self, item: _Waiting) -> None:
        """``executor.submit`` of a slot task that refuses to be run inline.

        Raises:
            RejectedError: the executor refused it, or ``caller_runs`` ran it in this thread
                (the backend's I/O thread must not run ``check_local``).

        Why a thread-local flag and not a look at the executor's figures first: only
        ``TxExecutor.submit`` knows, under its lock, whether it runs the task in the caller; the
        flag is set exactly while this thread is inside that call, so the task sees it only when
        it runs inline here, never on a worker."""
        self._submitting.active = True
        try:
            submitted = self.executor.submit(self._run_slot, item)
        finally:
            self._submitting.active = False
        if _ran_here(submitted):
            cfg = self.executor.config
            raise RejectedError(
                f"executor {self.executor.name!r} is full ({cfg.concurrency} threads busy, "
                f"{cfg.queue_capacity} tasks queued) and rejection='caller_runs' would run "
                "check_local on the backend's I/O thread, which must not block"
            )
        submitted.add_done_callback(lambda done: self._slot_task_ended(item, done))

    def _run_slot(self, item: _Waiting) -> _NotHere | None:
        """An executor task holding one slot: ``item``, then waiting checks (see above)."""
        if getattr(self._submitting, "active", False):
            return _NOT_HERE  # caller_runs inline in the submitting thread: refuse
        current: _Waiting | None = item
        while current is not None:
            if self.executor.is_shutdown:  # closing: waiting checks are not started any more
                self._refused(
                    current.answer, current.key, f"executor {self.executor.name!r} is shut down"
                )
            else:
                self._check_one(current)
            current = self._take_next()
            if current is not None and self._others_wait():
                try:
                    self._to_executor(current)  # queued behind the others; this thread is theirs
                    return None
                except BaseException:  # noqa: BLE001, S110 - full (or inline): keep it in this thread
                    pass
        return None

    def _others_wait(self) -> bool:
        """Other work waits in the executor's queue and there is room behind it (a full queue
        would refuse the hand-over and count a rejection that loses nothing)."""
        queued = self.executor.stats().queued
        return 0 < queued < self.executor.config.queue_capacity

    def _run_check(self, message: Message) -> LocalTransactionState:
        """``check_local`` inside its ``check <topic>`` span (run_check_local never raises)."""
        checking = self._telemetry.checking(message)
        try:
            state = run_check_local(self.listener, message, self.spec, self.bridge)
            checking.answer(state)
            return state
        finally:
            checking.close()

    def _check_one(self, item: _Waiting) -> None:
        try:
            state = self._run_check(item.message)
        except BaseException as exc:  # noqa: BLE001 - run_check_local never raises; be sure
            self._dispatch_failed(item.key, exc)
            state = UNKNOW
        item.answer.set_result(state if isinstance(state, LocalTransactionState) else UNKNOW)

    def _take_next(self) -> _Waiting | None:
        """With a slot held: the next waiting check to run on it (now running, so no longer
        cancellable), or None after giving the slot back."""
        with self._lock:
            while self._waiting:
                waiting = self._waiting.popleft()
                if waiting.answer.set_running_or_notify_cancel():
                    return waiting
            self._started -= 1
            return None

    def _slot_task_ended(self, item: _Waiting, done: Future[Any]) -> None:
        """A slot task that never ran (cancelled by ``shutdown(cancel_pending=True)``) still
        answers its check and those waiting for its slot: UNKNOW, case d.

        Runs inside the executor's lock (``shutdown`` cancels under it): must not call the
        executor, so the waiting checks are refused here rather than launched."""
        if done.cancelled():
            current: _Waiting | None = item
            while current is not None:
                if not current.answer.done():
                    self._refused(
                        current.answer, current.key, f"executor {self.executor.name!r} is shut down"
                    )
                current = self._take_next()
        elif done.exception() is not None:  # _run_slot catches everything: a bug
            log.error(
                "group=%s: check slot task failed; its slot is lost",
                self.spec.group,
                exc_info=done.exception(),
            )

    def _refused(self, answer: Future[LocalTransactionState], key: str | None, why: str) -> None:
        with self._lock:
            self._rejected += 1
        log.warning(
            "group=%s key=%s: check-back not run: %s; answering UNKNOW so the broker checks "
            "again later",
            self.spec.group,
            key,
            why,
        )
        answer.set_result(UNKNOW)  # joiners too

    def _note_overdue(self, running: _InFlight, key: str | None) -> None:
        """A non-blocking re-check joined a check older than ``wait_timeout``: say so (the
        blocking entry's timeout WARNING), since no answer goes out until it returns."""
        age = time.monotonic() - running.started
        if running.future.done() or age <= self.wait_timeout:
            return
        with self._lock:
            self._timed_out += 1
        log.warning(
            "group=%s key=%s: check still unanswered after %.0fs (longer than %ss); the "
            "broker's re-check joined it, no answer until it returns (the broker will check again)",
            self.spec.group,
            key,
            age,
            self.wait_timeout,
        )

    def _track(self, key: str, future: Future[LocalTransactionState]) -> None:
        self._in_flight[key] = _InFlight(future, time.monotonic())

        def forget(done: Future[LocalTransactionState]) -> None:
            with self._lock:
                entry = self._in_flight.get(key)
                if entry is not None and entry.future is done:
                    del self._in_flight[key]

        future.add_done_callback(forget)

    def _wait(
        self, future: Future[LocalTransactionState], key: str | None
    ) -> LocalTransactionState:
        try:
            state = future.result(timeout=self.wait_timeout)
        except CancelledError:  # joined a waiting non-blocking check its backend cancelled
            return UNKNOW
        except FutureTimeout:
            with self._lock:
                self._timed_out += 1
            log.warning(
                "group=%s key=%s: check_local still running after %ss; answering UNKNOW "
                "(the broker will check again)",
                self.spec.group,
                key,
                self.wait_timeout,
            )
            return UNKNOW
        return state if isinstance(state, LocalTransactionState) else UNKNOW

    def stats(self) -> DispatchStats:
        """A snapshot of the counters."""
        with self._lock:
            return DispatchStats(
                checks=self._checks,
                deduplicated=self._deduplicated,
                rejected=self._rejected,
                timed_out=self._timed_out,
                in_flight=len(self._in_flight),
                waiting=sum(1 for w in self._waiting if not w.answer.cancelled()),
            )


def _ran_here(submitted: Future[Any]) -> bool:
    """True when a non-blocking check was run inline by ``caller_runs`` (and so refused)."""
    return (
        submitted.done()
        and not submitted.cancelled()
        and submitted.exception() is None
        and submitted.result() is _NOT_HERE
    )


def _answered(state: LocalTransactionState) -> Future[LocalTransactionState]:
    future: Future[LocalTransactionState] = Future()
    future.set_result(state)
    return future


def _state_of(done: Future[Any]) -> LocalTransactionState:
    """A finished check's answer; UNKNOW if it was cancelled (shutdown) or failed."""
    if done.cancelled() or done.exception() is not None:
        return UNKNOW  # run_check_local never raises; keep joiners safe anyway
    state = done.result()
    return state if isinstance(state, LocalTransactionState) else UNKNOW


def _key(message: Message) -> str | None:
    try:
        return message.transaction_key
    except Exception:  # noqa: BLE001
        return None
