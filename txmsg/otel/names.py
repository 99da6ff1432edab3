"""The names txmsg's telemetry uses: instruments, attributes, span events.

Fixed, so dashboards and alerts can rely on them (``docs/guide/observability.md`` lists each with
what it counts; ``docs/grafana/txmsg-dashboard.json`` queries them).  The ``messaging.*`` names are
OpenTelemetry's messaging semantic conventions; the ``txmsg.*`` ones are what only txmsg knows
(local transactions, check-backs, the executor, parked keys, the outbox).  Plain strings: this
module imports nothing, so the names are usable without OpenTelemetry installed.
"""

from __future__ import annotations

from typing import Final

# ---- instruments ----------------------------------------------------------------------------------
SENT_MESSAGES: Final = "messaging.client.sent.messages"
"""Counter {message}: messages txmsg handed to the broker (transactional and plain sends);
``error.type`` set when the send failed."""
OPERATION_DURATION: Final = "messaging.client.operation.duration"
"""Histogram s: one send call (a transactional send includes ``execute_local``)."""
PROCESS_DURATION: Final = "messaging.process.duration"
"""Histogram s: one delivery handed to a ``@message_listener`` (``error.type`` when it is to be
delivered again)."""
CONSUMED_MESSAGES: Final = "messaging.client.consumed.messages"
"""Counter {message}: deliveries handed to ``@message_listener`` functions."""
LOCAL_TRANSACTIONS: Final = "txmsg.local_transactions"
"""Counter {transaction}: ``execute_local`` answers of sends that reached the broker, by
``txmsg.local_transaction.result`` (commit / rollback / unknown)."""
CHECKS: Final = "txmsg.checks"
"""Counter {check}: check-backs received and answered, by ``txmsg.check.result``."""
CHECK_DURATION: Final = "txmsg.check.duration"
"""Histogram s: from a check-back's arrival to its answer (queueing, joining and
``check_local``)."""
EXECUTOR_QUEUED: Final = "txmsg.executor.queued"
"""Gauge {task}: tasks waiting for a thread of the group's executor."""
EXECUTOR_ACTIVE: Final = "txmsg.executor.active"
"""Gauge {thread}: executor threads running a task."""
EXECUTOR_REJECTED: Final = "txmsg.executor.rejected"
"""Counter {task}: tasks the executor refused (``rejection='abort'`` with a full pool)."""
PARKED_KEYS: Final = "txmsg.parked_keys"
"""Gauge {key}: sharding keys an orderly consumer group has parked (read from its database)."""
OUTBOX_UNSENT: Final = "txmsg.outbox.unsent"
"""Gauge {row}: outbox rows not sent yet (outboxes whose relay runs in this process)."""
OUTBOX_OLDEST_AGE: Final = "txmsg.outbox.oldest_unsent_age"
"""Gauge s: age of the oldest unsent outbox row (0 when none)."""
DISCARDS: Final = "txmsg.discards"
"""Counter {message}: half messages of the group the broker discarded after its last check-back,
as the rescuer (:mod:`txmsg.rescue`) handled them, by ``txmsg.discard.outcome``: ``rescued``
(committed: sent to its topic), ``rolled_back``, ``retried`` (no answer yet: asked again later,
once per attempt), ``dead`` (given up: a dead row and ``on_transaction_discarded``)."""

INSTRUMENTS: Final[dict[str, tuple[str, str]]] = {
    SENT_MESSAGES: ("counter", "{message}"),
    OPERATION_DURATION: ("histogram", "s"),
    PROCESS_DURATION: ("histogram", "s"),
    CONSUMED_MESSAGES: ("counter", "{message}"),
    LOCAL_TRANSACTIONS: ("counter", "{transaction}"),
    CHECKS: ("counter", "{check}"),
    CHECK_DURATION: ("histogram", "s"),
    EXECUTOR_QUEUED: ("gauge", "{task}"),
    EXECUTOR_ACTIVE: ("gauge", "{thread}"),
    EXECUTOR_REJECTED: ("counter", "{task}"),
    PARKED_KEYS: ("gauge", "{key}"),
    OUTBOX_UNSENT: ("gauge", "{row}"),
    OUTBOX_OLDEST_AGE: ("gauge", "s"),
    DISCARDS: ("counter", "{message}"),
}
"""Every instrument: name -> (kind, unit).  The kinds are what Prometheus sees (an observable
counter is a counter)."""

# ---- attributes -----------------------------------------------------------------------------------
SYSTEM: Final = "messaging.system"
DESTINATION: Final = "messaging.destination.name"
OPERATION_NAME: Final = "messaging.operation.name"
OPERATION_TYPE: Final = "messaging.operation.type"
CONSUMER_GROUP: Final = "messaging.consumer.group.name"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
BODY_SIZE: Final = "messaging.message.body.size"
ROCKETMQ_KEYS: Final = "messaging.rocketmq.message.keys"
ROCKETMQ_TAG: Final = "messaging.rocketmq.message.tag"
ROCKETMQ_TYPE: Final = "messaging.rocketmq.message.type"
ROCKETMQ_GROUP: Final = "messaging.rocketmq.message.group"
ROCKETMQ_DELAY_LEVEL: Final = "messaging.rocketmq.message.delay_time_level"
ROCKETMQ_DELIVERY_TIMESTAMP: Final = "messaging.rocketmq.message.delivery_timestamp"
ROCKETMQ_CONSUMPTION_MODEL: Final = "messaging.rocketmq.consumption_model"
ERROR_TYPE: Final = "error.type"
PRODUCER_GROUP: Final = "txmsg.producer.group"
"""The producer group (the conventions name no producer-group attribute for RocketMQ)."""
TRANSACTION_KEY: Final = "txmsg.transaction_key"
LOCAL_RESULT: Final = "txmsg.local_transaction.result"
CHECK_RESULT: Final = "txmsg.check.result"
RECONSUME_TIMES: Final = "txmsg.reconsume_times"
SHARDING_KEY: Final = "txmsg.sharding_key"
ATTEMPT: Final = "txmsg.attempt"
DISCARD_OUTCOME: Final = "txmsg.discard.outcome"
DISCARD_OUTCOMES: Final = ("rescued", "rolled_back", "retried", "dead")

ROCKETMQ: Final = "rocketmq"

# ---- span events ----------------------------------------------------------------------------------
EVENT_RETRY: Final = "txmsg.retry"
"""The delivery failed and the message comes again: redelivered later (concurrent listeners) or
tried again in place (orderly listeners, ``txmsg.attempt``)."""
EVENT_DEAD_LETTER: Final = "txmsg.dead_letter"
"""The delivery failed after ``max_reconsume`` redeliveries: the backend moves it to
``%DLQ%<group>``."""
EVENT_PARKED: Final = "txmsg.parked"
"""An orderly listener failed ``max_orderly_retries`` times: the sharding key is parked."""
EVENT_PARKED_BEHIND: Final = "txmsg.parked_behind"
"""The message's sharding key was parked already: the message is parked behind it."""

TRACE_PROPERTIES: Final = ("traceparent", "tracestate")
"""The W3C Trace Context fields the default propagator writes into a message's user properties."""
