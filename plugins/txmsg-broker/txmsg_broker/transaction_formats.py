"""Constants of the transactional message service and the Java texts its log lines quote.

Shared by the service (:mod:`.transaction_service`), its check pass (:mod:`.check_service`), its
op batch (:mod:`.op_batch`), END_TRANSACTION (:mod:`.end_transaction`) and the gRPC endpoint, so a
line reads the same whichever path wrote it.
"""

from __future__ import annotations

import time
import zlib

from .message_codec import StoredMessage, encoded_size

SYSTEM_GROUP = "CID_RMQ_SYS_TRANS"
CHECK_THREAD = "TransactionalMessageCheckService"
CHECK_SEND_THREAD = "Transaction-msg-check-thread"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
OP_TAG = "d"
#: 5.x ``TransactionalMessageUtil.OFFSET_SEPARATOR``: one op message lists several half offsets
OFFSET_SEPARATOR = ","
#: 5.x ``TransactionalMessageServiceImpl.SLEEP_WHILE_NO_OP`` (ms)
SLEEP_WHILE_NO_OP_MS = 1000
OP_BATCH_THREAD = "TransactionalOpBatchService"
#: ``ReputMessageService`` (4.9.8 and 5.3.3) sleeps 1 ms between dispatch rounds: a message put into
#: the half queue becomes readable there (its consume-queue entry) up to this long after the put
REPUT_INTERVAL_S = 0.001


def java_bool(raw: str | None) -> bool:
    """``Boolean.parseBoolean``: true only for "true" (any case). CPP's "1" is false."""
    return (raw or "").strip().lower() == "true"


def java_date(ms: int) -> str:
    return time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(ms / 1000))


def end_transaction_header(
    log_format: int,
    group: str,
    tsto: int,
    clo: int,
    state: int,
    from_check: bool,
    msg_id: str,
    tx_id: str,
) -> str:
    """``EndTransactionRequestHeader.toString()`` as the broker of ``log_format`` logs it.

    4 (4.9.5+): strings quoted, ``bname`` last; 5 (5.0+, Guava ``toStringHelper``): nothing quoted, no
    ``bname``. The field order is the same, and a missing string prints as ``null`` in both.
    """
    ftc = "true" if from_check else "false"
    if log_format == 5:
        return (
            f"EndTransactionRequestHeader{{producerGroup={group}, tranStateTableOffset={tsto}, "
            f"commitLogOffset={clo}, commitOrRollback={state}, fromTransactionCheck={ftc}, "
            f"msgId={msg_id}, transactionId={tx_id}}}"
        )
    return (
        f"EndTransactionRequestHeader{{producerGroup='{group}', tranStateTableOffset={tsto}, "
        f"commitLogOffset={clo}, commitOrRollback={state}, fromTransactionCheck={ftc}, "
        f"msgId='{msg_id}', transactionId='{tx_id}', bname='null'}}"
    )


def describe_message(msg: StoredMessage) -> str:
    """Java's ``MessageExt.toString()`` (as in the discard and op-write log lines)."""
    props = ", ".join(f"{k}={v}" for k, v in msg.properties.items())
    body = ", ".join(str(b - 256 if b > 127 else b) for b in msg.body)
    return (
        f"MessageExt [brokerName=null, queueId={msg.queue_id}, storeSize={encoded_size(msg)}, "
        f"queueOffset={msg.queue_offset}, sysFlag={msg.sys_flag}, bornTimestamp={msg.born_timestamp}, "
        f"bornHost=/{msg.born_host}, storeTimestamp={msg.store_timestamp}, storeHost=/{msg.store_host}, "
        f"msgId={msg.msg_id}, commitLogOffset={msg.commit_log_offset}, "
        f"bodyCRC={zlib.crc32(msg.body) & 0x7FFFFFFF}, reconsumeTimes={msg.reconsume_times}, "
        f"preparedTransactionOffset={msg.prepared_transaction_offset}, toString()=Message{{topic='{msg.topic}', "
        f"flag={msg.flag}, properties={{{props}}}, body=[{body}], transactionId='null'}}]"
    )


def op_offsets(body: bytes) -> list[int]:
    """Half-queue offsets named by an op record: 4.9.8 ``"12"``, 5.x ``"12,13,"``."""
    found = []
    for part in body.decode(errors="replace").split(OFFSET_SEPARATOR):
        part = part.strip()
        if part:
            try:
                found.append(int(part))
            except ValueError:
                continue
    return found


def int_or(raw: str | None, default: int) -> int:
    """A numeric property, or ``default`` when it is absent, empty or not a number (as Java's
    lenient parsing of message properties treats it)."""
    try:
        return int(raw) if raw not in (None, "") else default
    except ValueError:
        return default
