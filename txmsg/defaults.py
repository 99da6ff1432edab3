"""Every default of txmsg's public options, in one place.

Decorators, configuration models and backends import these names instead of repeating numbers,
so a default changes here and nowhere else.  The docs' settings table (docs/core.md) lists them.
"""

from __future__ import annotations

from typing import Final

from txmsg.states import LocalTransactionState

CHECK_CONCURRENCY: Final = 8
"""Check-backs of one producer group that run at once (= client instances = executor threads)."""
MAX_CHECK_CONCURRENCY: Final = 64
"""Upper bound of ``concurrency``: each unit is a real client instance with its own connection."""
QUEUE_CAPACITY: Final = 256
"""Async sends that may wait for an executor thread before the rejection policy applies."""
EXECUTE_EXCEPTION_STATE: Final = LocalTransactionState.UNKNOW
"""What an exception escaping ``execute_local`` answers: the check-back then decides."""

CONSUMER_CONCURRENCY: Final = 4
"""Threads that run one consumer group's ``@message_listener``."""
MAX_RECONSUME: Final = 16
"""Redeliveries of a failing message before RocketMQ moves it to the DLQ (RocketMQ's default)."""
TAGS: Final = "*"
"""Tag expression of a subscription: every tag."""

CHECK_WAIT_TIMEOUT: Final = 60.0
"""Seconds a check-back waits for ``check_local`` before answering UNKNOW (= no answer yet)."""
CLOSE_TIMEOUT: Final = 30.0
"""Seconds ``TxMsg.close()`` waits for each producer and consumer."""

MAX_ORDERLY_RETRIES: Final = 3
"""Failures of one message of an orderly listener before its sharding key is parked."""
ORDERLY_RETRY_DELAY: Final = 1.0
"""Seconds between those attempts (RocketMQ's ``suspendCurrentQueueTimeMillis``)."""
SEND_TIMEOUT: Final = 3.0
"""Seconds a synchronous send waits for the broker (RocketMQ's ``sendMsgTimeout``)."""
ASYNC_SEND_THREADS: Final = 64
"""Threads of an app's send pool, where the sends of ``app.async_producer(group)`` wait for the
broker (and a transactional send for its ``execute_local``): how many awaited sends can be in
flight at once before further ones queue (``TxMsg(async_send_threads=...)``)."""

RESCUE_DISCARDED: Final = True
"""Whether a transactional listener's group rescues the half messages the broker discarded after
``transactionCheckMax`` unanswered check-backs (:mod:`txmsg.rescue`)."""
RESCUE_ATTEMPTS: Final = 16
"""Rounds the rescuer spends on one discarded half message whose ``check_local`` keeps answering
UNKNOW before it gives up (a dead row and ``@app.on_transaction_discarded``).  Each round puts it
back into the broker's check cycle for one more horizon (``transactionCheckMax`` x
``transactionCheckInterval``: 15 min with the production defaults), so 16 rounds give a service
about 4 h after the first discard to answer."""
