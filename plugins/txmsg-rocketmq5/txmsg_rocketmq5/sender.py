"""The transactional sender of one producer group over the 5.x client.

Sends: ``begin_transaction()``, the half message, ``execute_local`` in the caller's thread, then
``commit()`` / ``rollback()``; UNKNOW sends nothing (as the 5.x Java client), so the broker checks
the transaction back.

Check-backs: one client per group is enough here (unlike librocketmq, where a client instance has
one check thread).  :class:`~.client.CheckingProducer` hands every command over on the client's I/O
loop, which must not block; this sender converts the message and calls the core's non-blocking
entry, :meth:`txmsg.dispatch.CheckDispatcher.submit`, which returns a future at once and runs
``check_local`` on the listener's executor: at most ``concurrency`` at once, a backlog waiting in the
dispatcher without threads, a re-check of the same transaction joining the waiting or running one.
The answer (``EndTransaction``) is sent from that future's done-callback, on the executor thread
that ran the check.  So a group's checks use the listener's ``concurrency`` executor threads and no
thread of this backend: an own pool here would double the threads, half of them only waiting for
the other half (the dispatcher's blocking entry, for librocketmq, must wait; this one need not).

One ``check_local`` run is answered once: a command that joined a running check (``joined``) sends
nothing more, its transaction is resolved by that check's answer.  A handler given without the
non-blocking entry (the backend used below the core, e.g. a bare function) has no executor: it runs
on a pool of ``check_concurrency`` threads of its own (:class:`_BareHandler`), without dedup.

The backend never answers on ``check_local``'s behalf: when a handler fails, or the check cannot run
(closing) it sends nothing and the broker asks again; every failure to answer is logged at ERROR.
An UNKNOW from the handler is sent as ``TRANSACTION_RESOLUTION_UNSPECIFIED`` (the broker logs it as
pending, like librocketmq's UNKNOW).  There is no wait timeout here: the answer goes out when
``check_local`` returns (see :mod:`txmsg.dispatch`, case b).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from txmsg.backend import CheckHandler, HalfMessage, LocalExecutor
from txmsg.dispatch import CheckSubmission, CheckSubmitter
from txmsg.errors import ProducerClosedError, SendError
from txmsg.message import Message, OutgoingMessage
from txmsg.states import LocalTransactionState

from . import messages
from ._client import Code, TransactionResolution
from ._client import Message as ClientMessage
from .client import CheckingProducer, shut_down

log = logging.getLogger("txmsg.rocketmq5")

RESOLUTION = {
    LocalTransactionState.COMMIT: TransactionResolution.COMMIT,
    LocalTransactionState.ROLLBACK: TransactionResolution.ROLLBACK,
    LocalTransactionState.UNKNOW: TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
}


class Rocketmq5Sender:
    """:class:`txmsg.backend.TransactionalSender` of one group on one 5.x ``Producer``."""

    def __init__(
        self,
        group: str,
        check_handler: CheckHandler,
        *,
        configuration: Any,
        topics: tuple[str, ...],
        check_concurrency: int,
        tls: bool = False,
    ) -> None:
        self.group = group
        self.topics = set(topics)
        self._lock = threading.Condition()
        self._closed = False
        self._client_down = False  # set after close() shut the client down
        self._sends = 0
        self._checks_running = 0  # commands handed over whose answer is not sent yet
        self._pending_checks: set[Future[Any]] = (
            set()
        )  # their futures: close() cancels unstarted ones
        self._answers_pending = 0
        self.checks_received = 0
        self.checks_answered = 0
        self.checks_failed = 0
        self.checks_not_run = 0
        self.checks_coalesced = 0
        self._bare: _BareHandler | None = None
        self._checks: CheckSubmitter
        if isinstance(check_handler, CheckSubmitter):
            self._checks = check_handler  # the core's dispatcher: its executor runs the checks
        else:
            self._bare = _BareHandler(check_handler, check_concurrency, group)
            self._checks = self._bare
        self.check_concurrency = check_concurrency
        try:
            self.producer = CheckingProducer(
                configuration, topics, on_check=self._on_check_command, tls=tls
            )
            self.producer.startup()
        except BaseException:
            if self._bare is not None:
                self._bare.shutdown()
            raise

    # ---- sends (caller thread) -----------------------------------------------------------------
    def send_in_transaction(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        self._begin_send()
        try:
            return self._send(message, local_executor)
        finally:
            self._sent_or_failed()

    def _send(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        outgoing = messages.to_client(message, ClientMessage, list_properties=True)
        new_topic = message.topic not in self.topics
        try:
            transaction = self.producer.begin_transaction()
            receipt = self.producer.send_half(outgoing, transaction, message.check_immunity_seconds)
        except Exception as exc:
            raise self._half_failed(message, exc) from exc
        if new_topic:
            self.topics.add(message.topic)
            self.producer.announce_topics()  # so check-backs of this topic reach us (client.py)
        message_id = str(receipt.message_id)
        half = messages.half_view(message, message_id)
        try:
            state = local_executor(half)
        except BaseException:  # the core's executor never raises; be sure
            log.error(
                "group=%s key=%s: local executor raised; leaving the transaction to the check-back",
                self.group,
                message_id,
                exc_info=True,
            )
            state = LocalTransactionState.UNKNOW
        coerced = LocalTransactionState.coerce(state)
        if coerced is None:
            log.warning(
                "group=%s key=%s: local executor returned %r; treating it as UNKNOW",
                self.group,
                message_id,
                state,
            )
            coerced = LocalTransactionState.UNKNOW
        self._end(transaction, coerced, message, message_id)
        return message_id, message_id, "SEND_OK", int(receipt.offset)

    @property
    def splits_sends(self) -> bool:
        """:class:`txmsg.backend.SplitTransactionalSender`: False when this client release lacks
        the steps :meth:`send_half_async` needs (the core then sends on a thread)."""
        return bool(self.producer.splits_sends)

    def send_half_async(self, message: OutgoingMessage) -> Future[HalfMessage]:
        """:class:`txmsg.backend.SplitTransactionalSender`: the half message without blocking.

        The returned future ends on the client's I/O thread (or on the thread of a retry), and
        always ends.  A half message whose future the caller cancelled meanwhile is left to the
        check-back (nothing is ended).  A topic whose route the client has not fetched yet (not
        declared on the listener and not sent to before) is sent from a thread of its own: the
        route fetch waits up to the request timeout, which must not happen on an event loop."""
        outgoing = messages.to_client(
            message, ClientMessage, list_properties=True
        )  # InvalidMessageError as is
        self._begin_send()
        result: Future[HalfMessage] = Future()

        def start() -> Future[Any]:
            transaction = self.producer.begin_transaction()
            return self.producer.send_half_async(
                outgoing, transaction, message.check_immunity_seconds
            )

        on_sent = functools.partial(self._on_half_sent, message, result)

        if message.topic in self.topics:  # its route is cached: nothing here waits
            try:
                sent = start()
            except Exception as exc:
                self._sent_or_failed()
                raise self._half_failed(message, exc) from exc
            sent.add_done_callback(on_sent)
            return result

        def from_thread() -> None:
            try:
                sent = start()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
                failed: Future[Any] = Future()
                failed.set_exception(exc)
                on_sent(failed)
                return
            sent.add_done_callback(on_sent)

        threading.Thread(target=from_thread, name="txmsg-rocketmq5-route", daemon=True).start()
        return result

    def _on_half_sent(
        self, message: OutgoingMessage, result: Future[HalfMessage], done: Future[Any]
    ) -> None:
        """The broker's answer to a half message of :meth:`send_half_async`: the caller's
        future gets the half message (or the error); one it cancelled meanwhile ends UNKNOW."""
        try:
            receipt = done.result()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
            self._sent_or_failed()
            if result.set_running_or_notify_cancel():
                failure = self._half_failed(message, exc)
                failure.__cause__ = exc
                result.set_exception(failure)
            return
        try:
            half = _Half(self, message, receipt)
        except BaseException as exc:  # noqa: BLE001 - stored, so the check-back resolves it
            self._sent_or_failed()
            if result.set_running_or_notify_cancel():
                result.set_exception(
                    SendError(
                        f"half message {receipt.message_id} to topic {message.topic!r} (group "
                        f"{self.group!r}) was stored but its answer could not be read "
                        f"({type(exc).__name__}: {exc}); the local transaction did not run, "
                        "the broker checks the transaction back"
                    )
                )
            return
        if message.topic not in self.topics:
            self.topics.add(message.topic)
            try:
                self.producer.announce_topics()  # as _send does
            except Exception:
                log.warning(
                    "group=%s: could not announce topic %s",
                    self.group,
                    message.topic,
                    exc_info=True,
                )
        if result.set_running_or_notify_cancel():
            result.set_result(half)
        else:  # the caller gave up waiting: the local transaction will not run
            half.end(LocalTransactionState.UNKNOW)

    def _half_failed(self, message: OutgoingMessage, exc: BaseException) -> SendError:
        return SendError(
            f"half message to topic {message.topic!r} (group {self.group!r}) failed: "
            f"{type(exc).__name__}: {exc}. The local transaction did not run. Check that the "
            "endpoints are right (`txmsg doctor`) and the topic exists as a transaction topic "
            "(`txmsg topic create <topic> --type transaction`)."
        )

    def _begin_send(self) -> None:
        """Count a send in flight (``close`` waits for it), unless closing."""
        with self._lock:
            if self._closed:
                raise ProducerClosedError(
                    f"producer group {self.group!r} is closing; create a new application/producer "
                    "to send more messages"
                )
            self._sends += 1

    def _sent_or_failed(self) -> None:
        """A send counted by :meth:`_begin_send` is over (``close`` waits for them)."""
        with self._lock:
            self._sends -= 1
            self._lock.notify_all()

    def _end(
        self, transaction: Any, state: LocalTransactionState, message: OutgoingMessage, key: str
    ) -> None:
        """Commit or roll back; a failure is not the send's failure (the half message is stored
        and the local transaction ran): log it, the broker checks the transaction back."""
        if state is LocalTransactionState.UNKNOW:
            return
        try:
            if state is LocalTransactionState.COMMIT:
                transaction.commit()
            else:
                transaction.rollback()
        except Exception as exc:  # noqa: BLE001 - reported, resolved by the check-back
            log.warning(
                "group=%s topic=%s key=%s: %s after the local transaction failed: %s; the broker "
                "will check the transaction back",
                self.group,
                message.topic,
                key,
                "commit" if state is LocalTransactionState.COMMIT else "rollback",
                exc,
            )

    # ---- check-backs ---------------------------------------------------------------------------
    def _on_check_command(self, endpoints: Any, msg: Any, transaction_id: str) -> None:
        """From the client's I/O loop: start the check and return at once (never blocks).

        The answer is sent by :meth:`_answer` when the check's future is done; a command that
        joined a check already queued or running for the same transaction is answered by that
        check (the broker re-sends checks of a transaction still unresolved every interval)."""
        with self._lock:
            self.checks_received += 1
            closed = self._closed
            if closed:
                self.checks_not_run += 1
            else:
                self._checks_running += 1
        if closed:
            log.warning(
                "group=%s transaction=%s: check-back not run: the producer is closing; no answer "
                "sent, the broker will check again",
                self.group,
                transaction_id,
            )
            return
        try:
            message = messages.from_client(ClientMessage().fromProtobuf(msg))
            submission = self._checks.submit(message)
        except BaseException as exc:  # noqa: BLE001 - a lost check must at least be logged
            self._settled()
            self._failed(transaction_id, f"{type(exc).__name__}: {exc}", exc_info=True)
            return
        if submission.joined:
            with self._lock:
                self.checks_coalesced += 1
            self._settled()
            return
        future = submission.future
        with self._lock:
            self._pending_checks.add(future)
        future.add_done_callback(
            lambda done: self._answer(done, endpoints, message, transaction_id)
        )

    def _answer(
        self, done: Future[Any], endpoints: Any, message: Message, transaction_id: str
    ) -> None:
        """The check finished (on the executor thread that ran it, or at once when refused):
        send its state; the RPC's reply is handled by :meth:`_replied`.  Never raises: a
        done-callback's exception would only be logged by ``concurrent.futures``."""
        with self._lock:
            self._pending_checks.discard(done)
        try:
            if done.cancelled():  # close() cancelled it before it started (logged there)
                with self._lock:
                    self.checks_not_run += 1
                return
            problem = done.exception()
            if problem is not None:  # only a bare handler: the core's dispatcher never fails
                self._failed(
                    transaction_id, f"{type(problem).__name__}: {problem}", exc_info=problem
                )
                return
            state = done.result()
            coerced = LocalTransactionState.coerce(state) or LocalTransactionState.UNKNOW
            with self._lock:
                down = self._client_down
            if down:  # close() timed out waiting for this check
                self._failed(
                    transaction_id, f"answer {coerced.name} not sent: the client is shut down"
                )
                return
            future = self.producer.end_checked(
                endpoints,
                message.topic,
                message.message_id or transaction_id,
                transaction_id,
                RESOLUTION[coerced],
            )
            with self._lock:
                self._answers_pending += 1  # before _settled: close sees no gap
            future.add_done_callback(lambda reply: self._replied(reply, transaction_id, coerced))
        except BaseException as exc:  # noqa: BLE001 - a lost check must at least be logged
            self._failed(transaction_id, f"{type(exc).__name__}: {exc}", exc_info=True)
        finally:
            self._settled()

    def _settled(self) -> None:
        """One check's answer sent (or abandoned): close() stops waiting for it."""
        with self._lock:
            self._checks_running -= 1
            self._lock.notify_all()

    def _replied(self, done: Any, transaction_id: str, state: LocalTransactionState) -> None:
        """The broker's reply to a check-back answer (on the client's I/O thread)."""
        try:
            problem = None
            try:
                reply = done.result()
                code = getattr(getattr(reply, "status", None), "code", None)
                if code is not None and int(code) != 20000:  # apache.rocketmq.v2.Code.OK
                    problem = (
                        f"the broker refused it: {code} {getattr(reply.status, 'message', '')}"
                    )
            except BaseException as exc:  # noqa: BLE001 - the RPC failed
                problem = f"{type(exc).__name__}: {exc}"
            if problem is None:
                with self._lock:
                    self.checks_answered += 1
            else:
                self._failed(transaction_id, f"answer {state.name} not delivered: {problem}")
        finally:
            with self._lock:
                self._answers_pending -= 1
                self._lock.notify_all()

    def _failed(
        self, transaction_id: str, why: str, *, exc_info: bool | BaseException = False
    ) -> None:
        with self._lock:
            self.checks_failed += 1
        log.error(
            "group=%s transaction=%s: check-back failed (the broker will check again): %s",
            self.group,
            transaction_id,
            why,
            exc_info=exc_info,
        )

    # ---- lifecycle -----------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """Refuse new sends, wait (bounded) for running sends and checks, shut the client down.

        Checks not started yet (waiting for a slot of the dispatcher, or queued in a bare
        handler's pool) are cancelled: dropped unanswered, the broker asks again.  Started ones are
        waited for (the core shuts the listener's executor down after this close).  A check
        still running at the deadline is logged and its answer is lost with the client.
        """
        deadline = time.monotonic() + (30.0 if timeout is None else max(0.0, timeout))
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._sends and self._lock.wait(max(0.0, deadline - time.monotonic())):
                pass
        with self._lock:
            waiting = list(self._pending_checks)
        dropped = sum(1 for future in waiting if future.cancel())  # started ones cannot be
        if dropped:
            log.warning(
                "producer group %s: closing; %d check-back(s) not started yet dropped unanswered "
                "(the broker checks them again)",
                self.group,
                dropped,
            )
        if self._bare is not None:
            self._bare.shutdown()
        with self._lock:
            while (self._checks_running or self._answers_pending) and self._lock.wait(
                max(0.0, deadline - time.monotonic())
            ):
                pass
            sends, checks = self._sends, self._checks_running + self._answers_pending
        if sends or checks:
            log.error(
                "producer group %s: %d send(s) and %d check-back(s) still running after the close "
                "timeout; shutting the client down anyway (their transactions are resolved by "
                "later check-backs). Give close() a longer timeout or make check_local return "
                "sooner.",
                self.group,
                sends,
                checks,
            )
        with self._lock:
            self._client_down = True
        shut_down(self.producer, f"producer group {self.group}")

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "checks_received": self.checks_received,
                "checks_answered": self.checks_answered,
                "checks_failed": self.checks_failed,
                "checks_not_run": self.checks_not_run,
                "checks_coalesced": self.checks_coalesced,
                "checks_running": self._checks_running,  # started, answer not sent yet
                "answers_pending": self._answers_pending,
                "sends_in_flight": self._sends,
            }


class _Half:
    """:class:`txmsg.backend.HalfMessage` of :meth:`Rocketmq5Sender.send_half_async`."""

    send_status = "SEND_OK"

    def __init__(self, sender: Rocketmq5Sender, message: OutgoingMessage, receipt: Any) -> None:
        self._sender = sender
        self._receipt = receipt
        self._topic = message.topic
        self.message_id = str(receipt.message_id)
        self.transaction_key = self.message_id
        self.offset: int | None = int(receipt.offset)
        self.message: Message = messages.half_view(message, self.message_id)

    def end(self, state: LocalTransactionState) -> Future[None]:
        """Commit or roll back without blocking (UNKNOW: nothing); the future never fails."""
        ended: Future[None] = Future()
        sender = self._sender

        def finish() -> None:
            sender._sent_or_failed()
            if ended.set_running_or_notify_cancel():  # nobody may wait any more
                ended.set_result(None)

        if state is LocalTransactionState.UNKNOW:
            finish()
            return ended
        receipt = self._receipt
        try:
            rpc = sender.producer.end_async(
                receipt.message_queue.endpoints,
                self._topic,
                self.message_id,
                receipt.transaction_id,
                RESOLUTION[state],
            )
        except Exception as exc:  # noqa: BLE001 - reported, resolved by the check-back
            self._failed(state, exc)
            finish()
            return ended

        def on_end(done: Future[Any]) -> None:
            try:
                answer = done.result()
                if answer.status.code != Code.OK:
                    raise SendError(f"{answer.status.code}: {answer.status.message}")
            except Exception as exc:  # noqa: BLE001 - reported, resolved by the check-back
                self._failed(state, exc)
            finally:
                finish()

        rpc.add_done_callback(on_end)
        return ended

    def _failed(self, state: LocalTransactionState, exc: BaseException) -> None:
        log.warning(
            "group=%s topic=%s key=%s: %s after the local transaction failed: %s; the broker "
            "will check the transaction back",
            self._sender.group,
            self._topic,
            self.message_id,
            "commit" if state is LocalTransactionState.COMMIT else "rollback",
            exc,
        )


class _BareHandler:
    """A check handler without the non-blocking entry, on a pool of its own.

    Why: the core always gives its :class:`~txmsg.dispatch.CheckDispatcher` (whose executor runs
    the checks), but the backend may be used below the core with a plain function, which cannot
    run on the client's I/O loop.  Its failures reach :meth:`Rocketmq5Sender._answer` as the
    future's exception (logged, no answer sent); no dedup (that is the dispatcher's)."""

    def __init__(self, handler: CheckHandler, concurrency: int, group: str) -> None:
        self._handler = handler
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix=f"txmsg5-check-{group}"
        )

    def submit(self, message: Message) -> CheckSubmission:
        return CheckSubmission(self._pool.submit(self._handler, message), joined=False)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
