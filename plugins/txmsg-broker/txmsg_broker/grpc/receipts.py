"""Receipt handles: what a 5.x client gets with each delivery and sends back with Ack/ChangeInvisible.

Why the broker's own format: a real proxy hands out ``ReceiptHandle.encode()`` - the pop checkpoint's
extra info (``startOffset popTime invisibleTime reviveQid topicType brokerName queueId offset``) plus the
commit log offset, separated by spaces - and decodes it again on ack. Keeping the layout means the same
handle text, the same "expired" rule (``popTime + invisibleTime <= now``) and the same answers for a
handle that does not parse (the proxy's ``IllegalArgumentException`` / ``NumberFormatException`` end up
as INTERNAL_SERVER_ERROR with Java's detail message).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .status import ProxyError
from .stubs import Code

SEPARATOR = " "
NORMAL_TOPIC = "0"
#: ``KeyBuilder.POP_ORDER_REVIVE_QUEUE``: the revive queue id of orderly (FIFO) pops
ORDER_REVIVE_QUEUE = 999
_DECODE_SITE = "org.apache.rocketmq.common.consumer.ReceiptHandle.decode(ReceiptHandle.java:56)"
_NUMBER_SITE = "java.lang.NumberFormatException.forInputString(NumberFormatException.java:67)"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class ReceiptHandle:
    start_offset: int
    pop_time: int
    invisible_ms: int
    revive_queue_id: int
    topic_type: str
    broker_name: str
    queue_id: int
    offset: int
    commit_log_offset: int = -1

    @property
    def next_visible_time(self) -> int:
        return self.pop_time + self.invisible_ms

    def is_expired(self, now: int | None = None) -> bool:
        """``ReceiptHandle.isExpired``: the delivery it names is visible again (or about to be)."""
        return self.next_visible_time <= (now if now is not None else now_ms())

    def encode(self) -> str:
        return SEPARATOR.join(
            str(part)
            for part in (
                self.start_offset,
                self.pop_time,
                self.invisible_ms,
                self.revive_queue_id,
                self.topic_type,
                self.broker_name,
                self.queue_id,
                self.offset,
                self.commit_log_offset,
            )
        )


def _java_long(text: str) -> int:
    """``Long.parseLong``: optional sign and ASCII digits only, else NumberFormatException's text."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or not body.isascii() or not body.isdigit():
        raise ProxyError(
            Code.INTERNAL_SERVER_ERROR,
            f'For input string: "{text}". NumberFormatException. {_NUMBER_SITE}',
        )
    return int(text)


def decode(text: str) -> ReceiptHandle:
    """``ReceiptHandle.decode`` with the proxy's answer for a handle that does not parse.

    Java splits on the separator as a regex and drops trailing empty strings; so does this.
    """
    parts = text.split(SEPARATOR)
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 8:
        size = 1 if text == "" else len(parts)  # Java: "".split(" ") is [""]
        raise ProxyError(
            Code.INTERNAL_SERVER_ERROR,
            f"Parse failed, dataList size {size}. IllegalArgumentException. {_DECODE_SITE}",
        )
    return ReceiptHandle(
        start_offset=_java_long(parts[0]),
        pop_time=_java_long(parts[1]),
        invisible_ms=_java_long(parts[2]),
        revive_queue_id=_java_long(parts[3]),
        topic_type=parts[4],
        broker_name=parts[5],
        queue_id=_java_long(parts[6]),
        offset=_java_long(parts[7]),
        commit_log_offset=_java_long(parts[8]) if len(parts) >= 9 else -1,
    )


def expired() -> ProxyError:
    """``AbstractProcessor.EXPIRED_HANDLE_PROXY_EXCEPTION``."""
    return ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired")


def unknown_broker(name: str) -> ProxyError:
    """``ClusterMessageService.resolveBrokerAddrInReceiptHandle``: a handle of a broker we are not."""
    return ProxyError(Code.INVALID_RECEIPT_HANDLE, f"cannot find broker {name}")
