"""The transactional sender of one producer group over the 5.x client.

Sends: ``begin_transaction()``, the half message, ``execute_local`` in the caller's thread, then
``commit()`` / ``rollback()``; UNKNOW sends nothing (as the 5.x Java client), so the broker checks
the transaction back.

Check-backs: one client per group is enough here (unlike librocketmq, where a client instance has
one check thread): :class:`~.client.CheckingProducer` hands every command to this sender, which runs
it on a pool of exactly ``check_concurrency`` threads.  Each thread calls the core's check handler
(the dispatcher, which runs ``check_local`` on the listener's executor and may join a running check
of the same transaction) and answers with ``EndTransaction``.  The backend never answers on
``check_local``'s behalf: when it cannot run a check (closing) it sends nothing and the broker asks
again; every failure to answer is logged at ERROR.  An UNKNOW from the handler is sent as
``TRANSACTION_RESOLUTION_UNSPECIFIED`` (the broker logs it as pending, like librocketmq's UNKNOW).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from txmsg.backend import CheckHandler, LocalExecutor
from txmsg.errors import ProducerClosedError, SendError
from txmsg.message import OutgoingMessage
from txmsg.states import LocalTransactionState

from . import messages
from ._client import Message as ClientMessage
from ._client import TransactionResolution
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
        self._check_handler = check_handler
        self._lock = threading.Condition()
        self._closed = False
        self._sends = 0
        self._checks_running = 0
        self._answers_pending = 0
        self.checks_received = 0
        self.checks_answered = 0
        self.checks_failed = 0
        self.checks_not_run = 0
        self.checks_coalesced = 0
        self._outstanding: set[str] = set()
        self._pool = ThreadPoolExecutor(
            max_workers=check_concurrency, thread_name_prefix=f"txmsg5-check-{group}"
        )
        self.check_concurrency = check_concurrency
        self.producer = CheckingProducer(
            configuration, topics, on_check=self._on_check_command, tls=tls
        )
        try:
            self.producer.startup()
        except BaseException:
            self._pool.shutdown(wait=False, cancel_futures=True)
            raise

    # ---- sends (caller thread) -----------------------------------------------------------------
    def send_in_transaction(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        with self._lock:
            if self._closed:
                raise ProducerClosedError(
                    f"producer group {self.group!r} is closing; create a new application/producer "
                    "to send more messages"
                )
            self._sends += 1
        try:
            return self._send(message, local_executor)
        finally:
            with self._lock:
                self._sends -= 1
                self._lock.notify_all()

    def _send(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        outgoing = messages.to_client(message, ClientMessage)
        new_topic = message.topic not in self.topics
        try:
            transaction = self.producer.begin_transaction()
            receipt = self.producer.send_half(outgoing, transaction, message.check_immunity_seconds)
        except Exception as exc:
            raise SendError(
                f"half message to topic {message.topic!r} (group {self.group!r}) failed: "
                f"{type(exc).__name__}: {exc}. The local transaction did not run. Check that the "
                "endpoints are right (`txmsg doctor`) and the topic exists as a transaction topic "
                "(`txmsg topic create <topic> --type transaction`)."
            ) from exc
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
        """From the client's I/O thread: queue the check on this group's pool (never blocks).

        A command for a transaction that already has one queued or running is coalesced into it:
        the broker re-sends checks of a transaction still unresolved (every check interval), and
        its answer - sent by transaction id - resolves the newest copy.  Without this, re-checks
        would queue behind slow checks and hold pool threads that only wait for the same answer.
        """
        with self._lock:
            self.checks_received += 1
            if transaction_id in self._outstanding:
                self.checks_coalesced += 1
                return
            self._outstanding.add(transaction_id)
        try:
            self._pool.submit(self._run_check, endpoints, msg, transaction_id)
        except RuntimeError:  # pool shut down: closing
            with self._lock:
                self.checks_not_run += 1
                self._outstanding.discard(transaction_id)
            log.warning(
                "group=%s transaction=%s: check-back not run: the producer is closing; no answer "
                "sent, the broker will check again",
                self.group,
                transaction_id,
            )

    def _run_check(self, endpoints: Any, msg: Any, transaction_id: str) -> None:
        """On a pool thread: run the check, send the answer (its reply is handled by
        :meth:`_replied`; the transaction stays outstanding until then, so a re-check that
        arrives meanwhile is coalesced instead of running ``check_local`` again)."""
        with self._lock:
            self._checks_running += 1
        answered = False
        try:
            answered = self._answer(endpoints, msg, transaction_id)
        except BaseException as exc:  # noqa: BLE001 - a lost check must at least be logged
            self._failed(transaction_id, f"{type(exc).__name__}: {exc}", exc_info=True)
        finally:
            with self._lock:
                self._checks_running -= 1
                if not answered:
                    self._outstanding.discard(transaction_id)
                self._lock.notify_all()

    def _answer(self, endpoints: Any, msg: Any, transaction_id: str) -> bool:
        message = messages.from_client(ClientMessage().fromProtobuf(msg))
        state = self._check_handler(message)
        coerced = LocalTransactionState.coerce(state) or LocalTransactionState.UNKNOW
        future = self.producer.end_checked(
            endpoints, message.topic, message.message_id or transaction_id, transaction_id,
            RESOLUTION[coerced],
        )
        with self._lock:
            self._answers_pending += 1
        future.add_done_callback(lambda done: self._replied(done, transaction_id, coerced))
        return True

    def _replied(self, done: Any, transaction_id: str, state: LocalTransactionState) -> None:
        """The broker's reply to a check-back answer (on the client's I/O thread)."""
        try:
            problem = None
            try:
                reply = done.result()
                code = getattr(getattr(reply, "status", None), "code", None)
                if code is not None and int(code) != 20000:  # apache.rocketmq.v2.Code.OK
                    problem = f"the broker refused it: {code} {getattr(reply.status, 'message', '')}"
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
                self._outstanding.discard(transaction_id)
                self._lock.notify_all()

    def _failed(self, transaction_id: str, why: str, *, exc_info: bool = False) -> None:
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

        Checks still queued are dropped unanswered (the broker asks again); a check still running
        at the deadline is logged and its answer is lost with the client.
        """
        deadline = time.monotonic() + (30.0 if timeout is None else max(0.0, timeout))
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._sends and self._lock.wait(max(0.0, deadline - time.monotonic())):
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)
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
        shut_down(self.producer, f"producer group {self.group}")

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "checks_received": self.checks_received,
                "checks_answered": self.checks_answered,
                "checks_failed": self.checks_failed,
                "checks_not_run": self.checks_not_run,
                "checks_coalesced": self.checks_coalesced,
                "checks_running": self._checks_running,
                "answers_pending": self._answers_pending,
                "sends_in_flight": self._sends,
            }
