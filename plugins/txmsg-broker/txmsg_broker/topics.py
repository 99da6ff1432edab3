"""Topic configurations (queue counts, permissions, RocketMQ 5 ``message.type`` attribute), persisted.

Why attributes: RocketMQ 5 types topics (``mqadmin updateTopic -a +message.type=TRANSACTION``) and the
broker rejects a message whose kind does not match. We keep the same attribute name and syntax so the
``txmsg topic create`` command works against a real 5.x cluster too.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
DEFAULT_PERM = PERM_READ | PERM_WRITE

DEFAULT_TOPIC = "TBW102"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_TOPICS = {DEFAULT_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, CHECK_MAX_TIME_TOPIC, SCHEDULE_TOPIC}

#: Java's ``FAQUrl.suggestTodo(FAQUrl.APPLY_TOPIC_URL)``, appended to TOPIC_NOT_EXIST remarks
SUGGEST_APPLY_TOPIC = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
#: queues of ``TBW102`` (4.9.8 ``BrokerConfig.defaultTopicQueueNums``); a topic created by a send
#: gets min(the client's ``defaultTopicQueueNums`` (4 in librocketmq), this)
DEFAULT_TOPIC_QUEUE_NUMS = 8

MESSAGE_TYPE_ATTRIBUTE = "message.type"
MESSAGE_TYPES = ("NORMAL", "TRANSACTION", "FIFO", "DELAY", "MIXED")

_VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_LENGTH = 127


def validate_topic_name(topic: str) -> str | None:
    """None if valid, else a message saying what is wrong (mirrors Java's TopicValidator)."""
    if not topic:
        return "the topic name is empty; give a topic name"
    if len(topic) > MAX_TOPIC_LENGTH:
        return f"the topic name is longer than {MAX_TOPIC_LENGTH} characters"
    if not _VALID_TOPIC.match(topic):
        return (
            f"the topic name {topic!r} contains illegal characters; "
            "use only letters, digits, '%', '|', '_' and '-'"
        )
    return None


def parse_attributes(text: str) -> dict[str, str]:
    """``+message.type=TRANSACTION,+k=v`` (mqadmin syntax; ``-k`` deletions are ignored)."""
    attrs: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part or part.startswith("-"):
            continue
        part = part.lstrip("+")
        key, sep, value = part.partition("=")
        if sep and key:
            attrs[key.strip()] = value.strip()
    return attrs


@dataclass
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = DEFAULT_PERM
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def message_type(self) -> str | None:
        """The declared RocketMQ 5 message type, or None for untyped (accepts everything)."""
        value = self.attributes.get(MESSAGE_TYPE_ATTRIBUTE)
        return value.upper() if value else None

    def describe(self) -> str:
        """Java's TopicConfig.toString, as the real broker logs it."""
        perm = ("R" if self.perm & PERM_READ else "-") + ("W" if self.perm & PERM_WRITE else "-")
        perm += "X" if self.perm & PERM_INHERIT else "-"
        return (
            f"TopicConfig [topicName={self.topic_name}, readQueueNums={self.read_queue_nums}, "
            f"writeQueueNums={self.write_queue_nums}, perm={perm}, topicFilterType=SINGLE_TAG, "
            f"topicSysFlag={self.topic_sys_flag}, order={str(self.order).lower()}, "
            f"attributes={json.dumps(self.attributes, separators=(',', ':'))}]"
        )


class TopicManager:
    """Thread-safe topic table stored in ``<data_dir>/config/topics.json``."""

    def __init__(self, data_dir: str | Path, *, default_queue_nums: int = 4) -> None:
        self.path = Path(data_dir) / "config" / "topics.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.default_queue_nums = default_queue_nums
        self._lock = threading.RLock()
        self._topics: dict[str, TopicConfig] = {}
        #: called with the config after a topic was created or changed (a broker with external name
        #: servers registers again then: ``registration.py``)
        self._listeners: list[Callable[[TopicConfig], None]] = []
        self._load()
        for name, queues in (
            (DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS),
            (HALF_TOPIC, 1),
            (OP_HALF_TOPIC, 1),
            (SCHEDULE_TOPIC, 18),
        ):
            if name not in self._topics:
                perm = DEFAULT_PERM | (PERM_INHERIT if name == DEFAULT_TOPIC else 0)
                self._topics[name] = TopicConfig(name, queues, queues, perm)

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            raw = json.loads(self.path.read_text())
            for item in raw.get("topics", []):
                cfg = TopicConfig(**item)
                self._topics[cfg.topic_name] = cfg
        except (ValueError, TypeError, AttributeError):
            # keep serving: an unreadable table only loses topic metadata, never messages
            bad = self.path.with_suffix(".corrupt")
            os.replace(self.path, bad)

    def add_listener(self, fn: Callable[[TopicConfig], None]) -> None:
        self._listeners.append(fn)

    def _changed(self, config: TopicConfig) -> None:
        for fn in self._listeners:
            fn(config)

    def _save(self) -> None:
        payload = json.dumps({"topics": [asdict(t) for t in self._topics.values()]}, indent=1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(payload)
        os.replace(tmp, self.path)

    def get(self, topic: str) -> TopicConfig | None:
        with self._lock:
            return self._topics.get(topic)

    def all(self) -> list[TopicConfig]:
        with self._lock:
            return list(self._topics.values())

    def put(self, config: TopicConfig) -> TopicConfig:
        with self._lock:
            self._topics[config.topic_name] = config
            self._save()
        self._changed(config)
        return config

    def create_if_absent(
        self, topic: str, queue_nums: int | None = None, perm: int = DEFAULT_PERM
    ) -> tuple[TopicConfig, bool]:
        """(config, created)."""
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:
                return existing, False
            n = queue_nums if queue_nums is not None else self.default_queue_nums
            cfg = TopicConfig(topic, n, n, perm)
            self._topics[topic] = cfg
            self._save()
        self._changed(cfg)
        return cfg, True

    def create_in_send(
        self, topic: str, default_topic: str, client_default_queue_nums: int
    ) -> tuple[TopicConfig | None, bool, str]:
        """Create ``topic`` from ``default_topic`` as 4.9.8's ``createTopicInSendMessageMethod`` does.

        Returns (config, created, problem): the existing or new config, or None and why not (the
        default topic is missing or lacks the inherit permission).  Queue count min(client's default, the
        default topic's write queues); permission the default topic's without INHERIT.
        """
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:
                return existing, False, ""
            default = self._topics.get(default_topic)
            if default is None:
                return None, False, f"the default topic[{default_topic}] not exist."
            if not default.perm & PERM_INHERIT:
                return (
                    None,
                    False,
                    f"the default topic[{default_topic}] has no perm [{default.perm}]",
                )
            n = max(0, min(client_default_queue_nums, default.write_queue_nums))
            cfg = TopicConfig(topic, n, n, default.perm & ~PERM_INHERIT)
            self._topics[topic] = cfg
            self._save()
        self._changed(cfg)
        return cfg, True, ""
