"""Names a RocketMQ 5 proxy refuses beyond RocketMQ's own rule (entry point ``txmsg.name_rules: rocketmq5``).

The proxy's ``GrpcValidator`` checks topics with ``Validators.checkTopic`` (at most 127 characters,
where the remoting rule allows 255) and refuses system topics and system consumer groups.  Checking
them at registration gives the error long before the first send returns ``ILLEGAL_TOPIC``.
Producer groups are not sent over gRPC at all (the proxy uses the topic as producer group), so any
name RocketMQ's rule accepts is fine for them.  Light module: imports no client.
"""

from __future__ import annotations

from typing import Final

TOPIC_MAX_LENGTH: Final = 127
SYSTEM_TOPICS: Final = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
SYSTEM_TOPIC_PREFIX: Final = "rmq_sys_"
SYSTEM_GROUP_PREFIX: Final = "CID_RMQ_SYS_"
GROUP_MAX_LENGTH: Final = 120  # the proxy's GrpcValidator.validateConsumerGroup


def name_rule(kind: str, name: str) -> str | None:
    """None if a RocketMQ 5 proxy accepts ``name`` as ``kind``, else why not."""
    if kind == "topic":
        if len(name) > TOPIC_MAX_LENGTH:
            return (
                f"RocketMQ 5 proxies accept topics of at most {TOPIC_MAX_LENGTH} characters "
                f"(this one has {len(name)}); shorten it"
            )
        if name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIX):
            return (
                "it is a RocketMQ system topic, which RocketMQ 5 proxies refuse; use your own topic"
            )
        if name.startswith(("%RETRY%", "%DLQ%")):
            return "retry and dead-letter topics are the broker's; subscribe to your own topic"
    elif kind == "consumer_group":
        if name.startswith(SYSTEM_GROUP_PREFIX):
            return f"groups starting with {SYSTEM_GROUP_PREFIX!r} are RocketMQ system groups; rename it"
        if len(name) > GROUP_MAX_LENGTH:
            return (
                f"RocketMQ 5 proxies accept consumer groups of at most {GROUP_MAX_LENGTH} "
                f"characters (this one has {len(name)}); shorten it"
            )
    return None
