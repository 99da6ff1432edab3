"""END_TRANSACTION (37) over remoting, as Java's ``EndTransactionProcessor`` runs it.

The producer's answer is logged as the real broker logs it (``fromTransactionCheck`` parsed like
``Boolean.parseBoolean``: librocketmq's ``"1"`` is *false*), then applied to the half copy it names:
a commit stores the real message and the op record, a rollback the op record only
(:class:`.transaction_service.TransactionService`).  Kept apart from the service because the gRPC
endpoint ends transactions through the same service with its own request handling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .client_service import learn_producer_from_request
from .codec import RemotingCommand
from .message_codec import PROPERTY_PGROUP, StoredMessage
from .store import NotWritableError
from .topics import HALF_TOPIC
from .transaction_formats import (
    COMMIT,
    ROLLBACK,
    UNKNOWN,
    describe_message,
    end_transaction_header,
    java_bool,
)
from .transport import Connection
from .txlog import ThreadNames

if TYPE_CHECKING:
    from .transaction_service import TransactionService


def end_problem(half: StoredMessage | None, tsto: int, group: str | None) -> str | None:
    """Why an END_TRANSACTION cannot end ``half`` (the message at its commit-log offset), in
    the words of Java's ``EndTransactionProcessor.checkPrepareMessage``; None when it can.
    Remoting and gRPC requests are checked alike."""
    if half is None or half.topic != HALF_TOPIC:
        return "Find prepared transaction message failed"
    if half.queue_offset != tsto:
        return "The transaction state table offset wrong"
    if half.properties.get(PROPERTY_PGROUP, "") != group:
        return "The producer group wrong"
    return None


class EndTransactionProcessor:
    """Handles the END_TRANSACTION requests of one broker."""

    def __init__(self, service: TransactionService) -> None:
        self.service = service
        self.broker = service.broker
        self.tx = service.tx
        self._end_threads = ThreadNames("EndTransactionThread_", 12)

    async def handle(self, cmd: RemotingCommand, conn: Connection) -> None:
        """One END_TRANSACTION: log the answer, find the half message it names, end it."""
        thread = self._end_threads.next()
        group = cmd.ext("producerGroup")
        try:
            state = cmd.ext_int("commitOrRollback")
            tsto = cmd.ext_int("tranStateTableOffset")
            clo = cmd.ext_int("commitLogOffset")
        except ValueError as exc:
            self.broker.logs.broker.warn(
                thread, f"invalid END_TRANSACTION from {conn.remote_addr}: {exc}"
            )
            return None
        self.service.check_backs.note_answer(clo, cmd.ext_fields.get("transactionId"))
        from_check = java_bool(cmd.ext_fields.get("fromTransactionCheck"))
        header = end_transaction_header(
            self.broker.config.tx_log_format,
            group,
            tsto,
            clo,
            state,
            from_check,
            cmd.ext_fields.get("msgId", "null"),
            cmd.ext_fields.get("transactionId", "null"),
        )
        remark = "null" if cmd.remark is None else cmd.remark
        tx = self.tx
        debug = tx.enabled("DEBUG")
        if debug:
            tx.debug(thread, f"Transaction request:{header}")
        learn_producer_from_request(self.broker, group, conn, lambda: thread)
        addr = conn.remote_addr
        if not self._log_answer(thread, state, from_check, addr, header, remark):
            return None
        half = self._half_to_end(thread, cmd, group, tsto, clo, state, from_check, header, addr)
        if half is not None:
            self._apply_end(thread, half, state, header, debug)
        return None

    def _log_answer(
        self, thread: str, state: int, from_check: bool, addr: str, header: str, remark: str
    ) -> bool:
        """The transaction log's line for the producer's answer, as the real broker writes it;
        False when the request ends here (UNKNOW changes nothing; an unknown state is ignored)."""
        tx = self.tx
        if state == UNKNOWN:
            if from_check:
                tx.warn(
                    thread,
                    f"Check producer[{addr}] transaction state, but it's pending status.RequestHeader: {header} Remark: {remark}",
                )
            else:
                tx.warn(
                    thread,
                    f"The producer[{addr}] end transaction in sending message,  and it's pending status.RequestHeader: {header} Remark: {remark}",
                )
            return False
        if state == ROLLBACK:
            if from_check:
                tx.warn(
                    thread,
                    f"Check producer[{addr}] transaction state, the producer rollback the message.RequestHeader: {header} Remark: {remark}",
                )
            else:
                tx.warn(
                    thread,
                    f"The producer[{addr}] end transaction in sending message, rollback the message.RequestHeader: {header} Remark: {remark}",
                )
        elif state == COMMIT:
            if from_check:
                tx.warn(
                    thread,
                    f"Check producer[{addr}] transaction state, the producer commit the message.RequestHeader: {header} Remark: {remark}",
                )
        else:
            self.broker.logs.broker.warn(
                thread, f"END_TRANSACTION with unknown commitOrRollback={state} ignored: {header}"
            )
            return False
        return True

    def _half_to_end(
        self,
        thread: str,
        cmd: RemotingCommand,
        group: str | None,
        tsto: int,
        clo: int,
        state: int,
        from_check: bool,
        header: str,
        addr: str,
    ) -> StoredMessage | None:
        """The half message the request ends, or None (logged) when the broker refuses it: a
        late send-phase answer (5.x immunity), or a request that names no half message of its
        group at that offset."""
        half = self.service.store.lookup(clo)
        if (
            half is not None
            and half.topic == HALF_TOPIC
            and self.service.rejects_late_end(half, from_check)
        ):
            self.service.log_late_end(thread, state, cmd.ext_fields.get("msgId", "null"), clo)
            return None
        problem = end_problem(half, tsto, group)
        if problem is not None or half is None:
            self.broker.logs.broker.warn(thread, f"{problem}, request from {addr}: {header}")
            return None
        return half

    def _apply_end(
        self, thread: str, half: StoredMessage, state: int, header: str, debug: bool
    ) -> None:
        """Commit (the real message and the op record) or roll back (the op record only)."""
        try:
            if state == COMMIT:
                _real, op = self.service.commit(half)
            else:
                op = self.service.write_op(half)
        except NotWritableError as exc:  # full disk: the half stays and is checked back later
            self.broker.logs.broker.warn(
                thread,
                f"END_TRANSACTION not applied, the store is not writable ({exc}); the half "
                f"message stays and will be checked back: {header}",
            )
            return
        if debug and op is not None:
            self.tx.debug(
                thread,
                f"Transaction op message write successfully. messageId={op.msg_id}, queueId={op.queue_id} "
                f"msgExt:{describe_message(half)}",
            )
