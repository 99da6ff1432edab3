"""Check-backs: CHECK_TRANSACTION_STATE to a live channel of the producer group, and their answers.

The check pass (:mod:`.check_service`) decides *which* half message to ask about; this module asks
(over remoting, or a gRPC push for a 5.x client) and keeps the counts a manual clock reports: the
check-backs sent, and those a settle still waits for an answer to.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from .codec import CHECK_TRANSACTION_STATE
from .message_codec import (
    PROPERTY_PGROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    StoredMessage,
    encode_message,
)
from .transaction_formats import CHECK_SEND_THREAD, int_or

if TYPE_CHECKING:
    from .broker import Broker


class CheckBacks:
    """Sends check-backs for one broker and, on a manual clock, waits for their answers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.tx = broker.logs.transaction
        self.clock = broker.clock
        #: check-backs sent so far (all passes)
        self.checks_sent = 0
        #: manual clock only: check-backs sent and not answered yet, commit-log offset of the copy ->
        #: its transaction id (so ``advance`` can return once they are answered)
        self.awaiting: dict[int, str] = {}
        #: how long (wall seconds) a settle waits for those answers; then they are reported unanswered
        self.answer_timeout = 10.0
        #: transaction ids of check-backs that went unanswered within ``answer_timeout``
        self.unanswered: list[str] = []
        if self.clock.manual:
            hooks = getattr(self.clock, "settle_hooks", None)
            if hooks is not None:
                hooks.append(self._wait_for_answers)

    def send(self, msg: StoredMessage) -> bool:
        """Ask ``msg``'s producer group about it, round-robin over the group's live channels;
        False (logged as the real broker logs it) when no channel takes it."""
        group = msg.properties.get(PROPERTY_PGROUP, "")
        conn = self.broker.clients.next_producer_channel(group)
        if conn is None:
            self.tx.warn(
                CHECK_SEND_THREAD, f"Check transaction failed, channel is null. groupId={group}"
            )
            self.broker.logs.broker.warn(
                CHECK_SEND_THREAD,
                f"Check transaction failed, channel table is empty. groupId={group}",
            )
            return False
        push = getattr(conn, "push_transaction_check", None)
        if (
            push is not None
        ):  # a 5.x gRPC client (txmsg_broker.grpc): RecoverOrphanedTransactionCommand
            pushed = bool(push(msg))
            if pushed:
                self._sent(msg)
            return pushed
        real_topic = msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic)
        real_qid = int_or(msg.properties.get(PROPERTY_REAL_QID), msg.queue_id)
        body = encode_message(msg, topic=real_topic, queue_id=real_qid)
        uniq = msg.uniq_key
        ext = {
            "tranStateTableOffset": str(msg.queue_offset),
            "commitLogOffset": str(msg.commit_log_offset),
            "msgId": uniq,
            "transactionId": uniq,
            "offsetMsgId": msg.msg_id,
        }
        # 4.9 logs each check-back at DEBUG only; 5.1+ at INFO (countable at the default level)
        self.tx.log(
            "INFO" if self.broker.config.log_format == 5 else "DEBUG",
            CHECK_SEND_THREAD,
            f"Check transaction. real_topic={real_topic},uniqKey={uniq},offset={msg.queue_offset},"
            f"commitLogOffset={msg.commit_log_offset}",
        )
        if not conn.send_oneway(CHECK_TRANSACTION_STATE, ext, body):
            self.broker.logs.broker.error(
                CHECK_SEND_THREAD,
                f"Check transaction failed because invoke producer exception. group={group}, "
                f"msgId={msg.msg_id}, error=channel {conn.remote_addr} is closed",
            )
            return False
        self._sent(msg)
        return True

    def _sent(self, msg: StoredMessage) -> None:
        self.checks_sent += 1
        if self.clock.manual:  # only a manual clock's advance waits for answers
            self.awaiting[msg.commit_log_offset] = msg.uniq_key

    def note_answer(self, clo: int | None, transaction_id: str | None) -> None:
        """An END_TRANSACTION (remoting or gRPC) for a copy or transaction a check-back named."""
        if not self.awaiting:
            return
        if clo is not None and self.awaiting.pop(clo, None) is not None:
            return
        if transaction_id:
            for key, tx_id in list(self.awaiting.items()):
                if tx_id == transaction_id:
                    del self.awaiting[key]

    async def _wait_for_answers(self) -> bool:
        """Settle hook of the manual clock: wait (wall time, ``answer_timeout``) until every
        check-back sent has been answered; the ones that were not are listed in ``unanswered``.
        Returns whether there was anything to wait for."""
        if not self.awaiting:
            return False
        deadline = time.monotonic() + self.answer_timeout
        while self.awaiting and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        if self.awaiting:
            self.unanswered.extend(self.awaiting.values())
            self.awaiting.clear()
        return True
