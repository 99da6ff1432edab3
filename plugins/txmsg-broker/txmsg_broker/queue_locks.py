"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: the broker-side queue locks of orderly consumption.

Why: an orderly consumer may only consume a queue it holds the lock for, so that two clients never
process one queue's messages in parallel during a rebalance. Locks expire like Java's
``rebalanceLockMaxLiveTime`` (clients renew theirs periodically), so a crashed client's queues come free;
the lifetime is ``BrokerConfig.rebalance_lock_max_live_time_ms`` (Java: the system property
``rocketmq.broker.rebalance.lockMaxLiveTime``, 60 s).
Locks are not persisted: after a restart clients simply lock again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .clock import Clock, RealClock
from .codec import RemotingCommand
from .transport import Connection

#: orderly-consume queue locks expire like Java's ``rebalanceLockMaxLiveTime`` (60 s), the default
LOCK_TTL_S = 60.0

#: (group, topic, broker name, queue id)
LockKey = tuple[str, str, str, int]
#: (topic, broker name, queue id), a ``MessageQueue`` of the request body
QueueRef = tuple[str, str, int]


@dataclass
class _Lock:
    client_id: str
    expires: float


def _lock_request(cmd: RemotingCommand) -> tuple[str, str, list[QueueRef]]:
    try:
        data = json.loads(cmd.body or b"{}")
    except (
        UnicodeDecodeError,
        ValueError,
        RecursionError,
    ) as exc:  # RecursionError: nested too deep
        raise ValueError(f"lock body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("lock body must be a JSON object")
    group = str(data.get("consumerGroup") or "")
    client_id = str(data.get("clientId") or "")
    if not group or not client_id:
        raise ValueError("lock body needs 'consumerGroup' and 'clientId'")
    mqs: list[QueueRef] = []
    for item in data.get("mqSet") or []:
        if not isinstance(item, dict):
            raise ValueError("every mqSet entry must be an object")
        mqs.append(
            (
                str(item.get("topic", "")),
                str(item.get("brokerName", "")),
                int(item.get("queueId", 0)),
            )
        )
    return group, client_id, mqs


class QueueLocks:
    """The lock table of one broker and its two handlers."""

    def __init__(self, ttl_s: float = LOCK_TTL_S, clock: Clock | None = None) -> None:
        self._locks: dict[LockKey, _Lock] = {}
        #: a lock not renewed for this long is free (Java: ``isExpired``)
        self.ttl_s = ttl_s
        #: the broker's clock: Java stamps ``lastUpdateTimestamp`` with ``currentTimeMillis``
        self.clock: Clock = clock if clock is not None else RealClock()

    async def lock(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, client_id, mqs = _lock_request(cmd)
        now = self.clock.now() / 1000.0
        locked = []
        for topic, broker_name, queue_id in mqs:
            key = (group, topic, broker_name, queue_id)
            current = self._locks.get(key)
            if current is None or current.expires < now or current.client_id == client_id:
                self._locks[key] = _Lock(client_id, now + self.ttl_s)
                locked.append({"topic": topic, "brokerName": broker_name, "queueId": queue_id})
        return cmd.response(
            body=json.dumps({"lockOKMQSet": locked}, separators=(",", ":")).encode()
        )

    async def unlock(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, client_id, mqs = _lock_request(cmd)
        for topic, broker_name, queue_id in mqs:
            key = (group, topic, broker_name, queue_id)
            current = self._locks.get(key)
            if current is not None and current.client_id == client_id:
                del self._locks[key]
        return cmd.response()
