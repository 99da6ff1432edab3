"""A fixed thread pool per listener, and the one place the rejection policy is applied.

One number sizes a producer group: ``ExecutorConfig.concurrency`` is how many check-backs of the
group run at once.  It is also the number of real client instances the backend opens (librocketmq
delivers one instance's check-backs on one native thread) and the number of executor threads:
a fixed pool like Java's ``Executors.newFixedThreadPool(n)`` (core = max = ``concurrency``, no
keep-alive).  Threads start lazily, one when a task finds no idle thread, up to ``concurrency``.

Why not Java's core/max/queue trio: a ``ThreadPoolExecutor`` grows past core only when its queue
is full, so with core 8, max 16 and a roomy queue, 16 native threads handed in checks and only 8
ran - the other 8 client instances were idle.  A fixed pool does what its one number says.

``queue_capacity`` bounds the tasks waiting for a thread; in practice these are
``send_in_transaction_async`` calls (each native thread blocks for its check's answer, so at
most ``concurrency`` checks are ever outstanding).  When every thread is busy and the queue is
full, :meth:`TxExecutor.submit` - and nothing else - applies the rejection policy:

* ``abort`` raises :class:`~txmsg.errors.RejectedError` (the check dispatcher then answers
  UNKNOW with a WARNING; an async send is not sent);
* ``caller_runs`` (default) runs the task in the submitting thread: natural back-pressure.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Self

from pydantic import Field, field_validator

from txmsg.defaults import CHECK_CONCURRENCY, MAX_CHECK_CONCURRENCY, QUEUE_CAPACITY
from txmsg.errors import RejectedError
from txmsg.settings import Settings

log = logging.getLogger("txmsg.executor")


class RejectionPolicy(enum.Enum):
    """What :meth:`TxExecutor.submit` does when every thread is busy and the queue is full."""

    ABORT = "abort"
    """Raise :class:`~txmsg.errors.RejectedError` (a check-back is then answered UNKNOW)."""
    CALLER_RUNS = "caller_runs"
    """Run the task in the submitting thread (slows the submitter down: natural back-pressure)."""


def parse_rejection(value: object) -> object:
    """Accept "CALLER_RUNS"/"caller-runs" for "caller_runs"."""
    if not isinstance(value, str):
        return value
    return value.strip().lower().replace("-", "_")


class ExecutorConfig(Settings):
    """Sizing of one transactional listener's executor (see the module docstring).

    A bad value raises :class:`~txmsg.errors.ConfigError` (pydantic's detail in the message).
    """

    concurrency: int = Field(default=CHECK_CONCURRENCY, ge=1, le=MAX_CHECK_CONCURRENCY)
    """Check-backs of the group that run at once = executor threads = client instances."""
    queue_capacity: int = Field(default=QUEUE_CAPACITY, ge=0)
    """Tasks (in practice async sends) that may wait for a thread before ``rejection`` applies."""
    rejection: RejectionPolicy = RejectionPolicy.CALLER_RUNS
    """What happens to a task when every thread is busy and the queue is full."""

    @field_validator("rejection", mode="before")
    @classmethod
    def _policy_spelling(cls, value: object) -> object:
        return parse_rejection(value)


@dataclass(frozen=True)
class ExecutorStats:
    """A consistent snapshot of an executor's figures (taken under its lock)."""

    threads: int
    """Threads alive now (started lazily, at most ``concurrency``)."""
    active: int
    """Threads running a task right now."""
    queued: int
    """Tasks waiting for a thread."""
    completed: int
    """Tasks the pool's threads finished (successfully or with an exception)."""
    rejected: int
    """Submissions the pool could not take (full, or shut down), whatever happened to them then."""
    caller_ran: int
    """Rejected tasks the ``caller_runs`` policy ran in the submitting thread."""


class _Task:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(
        self,
        future: Future[Any],
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class TxExecutor:
    """Fixed pool of ``config.concurrency`` threads with a bounded queue (module docstring).

    Parameters:
        config: size, queue bound and rejection policy.
        name: prefix of the worker thread names (``<name>-<n>``), shown in logs and stack dumps.

    Worker threads are daemons so a forgotten executor never blocks interpreter exit; call
    :meth:`shutdown` (``TxMsg.close()`` does) to let queued work finish first.
    """

    def __init__(self, config: ExecutorConfig | None = None, name: str = "txmsg") -> None:
        self.config = config or ExecutorConfig()
        self.name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue: deque[_Task] = deque()
        self._workers: set[threading.Thread] = set()
        self._idle = 0
        self._active = 0
        self._completed = 0
        self._rejected = 0
        self._caller_ran = 0
        self._shutdown = False
        self._seq = itertools.count(1)

    @property
    def policy(self) -> RejectionPolicy:
        """The configured rejection policy."""
        return self.config.rejection

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on the pool and return its future.

        The only place the rejection policy is applied.  When every thread is busy and
        ``queue_capacity`` tasks wait: ``caller_runs`` runs ``fn`` here and returns its finished
        future; ``abort`` raises :class:`RejectedError`.

        Raises:
            RejectedError: the pool is full under ``abort``, or (under every policy) the
                executor is shut down.
        """
        task = _Task(Future(), fn, args, kwargs)
        run_here = False
        with self._lock:
            if self._shutdown:
                self._rejected += 1
                raise RejectedError(
                    f"executor {self.name!r} is shut down (the application is closing); "
                    "submit work before TxMsg.close()"
                )
            if self._idle > len(self._queue):  # an idle thread takes it
                self._queue.append(task)
                self._work.notify()
            elif len(self._workers) < self.config.concurrency:
                self._add_worker(task)
            elif len(self._queue) - self._idle < self.config.queue_capacity:
                self._queue.append(task)
            else:
                self._rejected += 1
                if self.config.rejection is not RejectionPolicy.CALLER_RUNS:
                    raise RejectedError(self._full_message())
                self._caller_ran += 1
                run_here = True
        if run_here:  # caller_runs: outside the lock, in this thread
            task.run()
        return task.future

    def _full_message(self) -> str:
        cfg = self.config
        return (
            f"executor {self.name!r} is full: {cfg.concurrency} threads busy and "
            f"{cfg.queue_capacity} tasks queued, so the task was not run (rejection='abort'); "
            "raise concurrency or queue_capacity, or use rejection='caller_runs'"
        )

    # ---- workers (called with the lock held) ----------------------------------------------------
    def _add_worker(self, first: _Task) -> None:
        thread = threading.Thread(
            target=self._worker_loop,
            args=(first,),
            name=f"{self.name}-{next(self._seq)}",
            daemon=True,
        )
        self._workers.add(thread)
        self._active += 1
        thread.start()

    def _worker_loop(self, first: _Task) -> None:
        task: _Task | None = first
        while task is not None:
            task.run()  # never raises: the outcome goes to the task's future
            with self._work:
                # One lock hold from "done" to "idle" (or the next task): a submitter that sees
                # active == 0 knows every started thread can take its task at once.
                self._active -= 1
                self._completed += 1
                task = self._next_task()

    def _next_task(self) -> _Task | None:
        """With the lock held: block for the next task (counted active), or None once shut
        down with an empty queue (the thread is then removed)."""
        while True:
            if self._queue:
                self._active += 1
                return self._queue.popleft()
            if self._shutdown:
                self._workers.discard(threading.current_thread())
                self._work.notify_all()  # shutdown(wait=True) waits on the same condition
                return None
            self._idle += 1
            try:
                self._work.wait()
            finally:
                self._idle -= 1

    # ---- figures and lifecycle -----------------------------------------------------------------
    def stats(self) -> ExecutorStats:
        """Live figures, consistent with each other."""
        with self._lock:
            return ExecutorStats(
                threads=len(self._workers),
                active=self._active,
                queued=len(self._queue),
                completed=self._completed,
                rejected=self._rejected,
                caller_ran=self._caller_ran,
            )

    @property
    def is_shutdown(self) -> bool:
        """True once shutdown() was called (threads may still be finishing)."""
        return self._shutdown

    def shutdown(
        self, wait: bool = True, timeout: float | None = None, *, cancel_pending: bool = False
    ) -> bool:
        """Stop taking tasks; queued tasks still run unless ``cancel_pending``.

        With ``wait``, block until every thread has exited or ``timeout`` seconds passed.
        Returns True when all threads are gone.
        """
        with self._work:
            self._shutdown = True
            if cancel_pending:
                while self._queue:
                    self._queue.popleft().future.cancel()
            self._work.notify_all()
            if not wait:
                return not self._workers
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._workers:
                if deadline is None:
                    self._work.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning(
                        "executor %s: %d threads still busy after %.1fs shutdown wait",
                        self.name,
                        len(self._workers),
                        timeout,
                    )
                    return False
                self._work.wait(remaining)
            return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True)

    def __repr__(self) -> str:
        s = self.stats()
        c = self.config
        return (
            f"<TxExecutor {self.name} concurrency={c.concurrency} threads={s.threads} "
            f"active={s.active} queue={s.queued}/{c.queue_capacity} rejection={c.rejection.value}>"
        )
