"""Orderly listeners: bounded in-place retries, then the sharding key is parked, not the queue.

The handler runs here as a backend would call it (one message at a time, in queue order), on an
in-memory SQLite database made with txmsg.sqla's engine helpers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from txmsg import ConfigError, ListenerDefinitionError, defaults
from txmsg.consumer import ConsumerSpec, build_consumer_spec
from txmsg.message import SHARDING_KEY, UNIQ_KEY, Message
from txmsg.orderly import ParkedEvent, replay_command
from txmsg.sqla import (
    create_engine,
    create_tables,
    make_session_factory,
    parked_keys,
    parked_messages,
)
from txmsg.sqla.models import metadata

GROUP = "refund-consumer"
TOPIC = "after-sales"


@pytest.fixture
def engine() -> Iterator[Engine]:
    # one shared connection: an in-memory SQLite database lives and dies with its connection
    engine = create_engine("sqlite://", poolclass=StaticPool)
    create_tables(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


def msg(uid: str, key: str | None = "order-1", **kw: Any) -> Message:
    return Message(
        topic=TOPIC,
        body=f'{{"id": "{uid}"}}'.encode(),
        tags="refund",
        keys=f"k-{uid}",
        properties={UNIQ_KEY: uid, "biz": "x"},
        message_id=f"msgid-{uid}",
        sharding_key=key,
        **kw,
    )


class Recorder:
    """A listener that records what it handled and fails on the message ids in ``poison``."""

    def __init__(self, poison: set[str] | None = None, fail_times: int | None = None) -> None:
        self.poison = poison or set()
        self.fail_times = fail_times  # fail the first N calls of a poison message only
        self.calls: list[str] = []
        self.handled: list[str] = []

    def __call__(self, message: Message) -> None:
        uid = message.properties[UNIQ_KEY]
        self.calls.append(uid)
        if uid in self.poison and (
            self.fail_times is None or self.calls.count(uid) <= self.fail_times
        ):
            raise RuntimeError(f"cannot refund {uid}")
        self.handled.append(uid)


def spec_for(
    fn: Callable[..., Any],
    sessions: sessionmaker[Session],
    *,
    retries: int = 3,
    delay: float = 0.0,
    idempotent: bool = False,
) -> ConsumerSpec:
    return build_consumer_spec(
        fn,
        topic=TOPIC,
        group=GROUP,
        orderly=True,
        max_orderly_retries=retries,
        orderly_retry_delay=delay,
        idempotent=idempotent,
        session_factory=sessions,
    )


# ---- definition --------------------------------------------------------------------------------
def test_spec_defaults_and_validation(sessions: sessionmaker[Session]) -> None:
    spec = build_consumer_spec(
        Recorder(), topic=TOPIC, group=GROUP, orderly=True, session_factory=sessions
    )
    assert spec.orderly
    assert spec.max_orderly_retries == defaults.MAX_ORDERLY_RETRIES
    assert spec.orderly_retry_delay == defaults.ORDERLY_RETRY_DELAY
    assert spec.session_factory is sessions
    plain = build_consumer_spec(Recorder(), topic=TOPIC, group=GROUP)
    assert not plain.orderly

    with pytest.raises(ListenerDefinitionError, match="orderly=True needs session_factory"):
        build_consumer_spec(Recorder(), topic=TOPIC, group=GROUP, orderly=True)
    with pytest.raises(ListenerDefinitionError, match="max_orderly_retries must be an int >= 1"):
        spec_for(Recorder(), sessions, retries=0)
    with pytest.raises(ListenerDefinitionError, match="orderly_retry_delay"):
        spec_for(Recorder(), sessions, delay=-1)
    with pytest.raises(ListenerDefinitionError, match="only apply to orderly=True"):
        build_consumer_spec(Recorder(), topic=TOPIC, group=GROUP, max_orderly_retries=5)


def test_concurrent_listener_handler_is_unchanged(sessions: sessionmaker[Session]) -> None:
    listener = Recorder(poison={"p"})
    handle = build_consumer_spec(listener, topic=TOPIC, group=GROUP).safe_handler(on_parked=())
    assert handle(msg("a")) is True
    assert handle(msg("p")) is False  # redelivered later by the broker: no retries, no parking
    assert listener.calls == ["a", "p"]


# ---- retries -----------------------------------------------------------------------------------
def test_success_needs_no_database_write(sessions: sessionmaker[Session]) -> None:
    listener = Recorder()
    handle = spec_for(listener, sessions).safe_handler()
    assert [handle(msg(uid)) for uid in ("a", "b")] == [True, True]
    assert listener.handled == ["a", "b"]
    assert parked_keys(sessions) == []


def test_transient_failure_is_retried_in_place_after_the_delay(
    sessions: sessionmaker[Session],
) -> None:
    listener = Recorder(poison={"a"}, fail_times=2)
    handle = spec_for(listener, sessions, retries=3, delay=0.05).safe_handler()
    started = time.monotonic()
    assert handle(msg("a")) is True
    assert time.monotonic() - started >= 0.1  # two waits between three attempts
    assert listener.calls == ["a", "a", "a"]
    assert listener.handled == ["a"]
    assert parked_keys(sessions) == []


# ---- parking -----------------------------------------------------------------------------------
def test_poison_message_parks_its_key_and_later_messages_behind_it_in_order(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    listener = Recorder(poison={"p1"})
    events: list[ParkedEvent] = []
    handle = spec_for(listener, sessions, retries=3).safe_handler(on_parked=[events.append])
    deliveries = [
        msg("p1", "order-1"),
        msg("x1", "order-2"),
        msg("p2", "order-1"),
        msg("x2", "order-2"),
        msg("p3", "order-1"),
    ]
    with caplog.at_level(logging.WARNING, logger="txmsg.orderly"):
        assert all(handle(m) for m in deliveries)  # the queue always moves on

    assert listener.calls == ["p1", "p1", "p1", "x1", "x2"]  # p2/p3 never reach the listener
    assert listener.handled == ["x1", "x2"]
    (key,) = parked_keys(sessions)
    assert (key.group, key.sharding_key, key.topic, key.messages) == (GROUP, "order-1", TOPIC, 3)
    assert key.reason == "RuntimeError: cannot refund p1"
    assert key.first_message_id == "msgid-p1"
    rows = parked_messages(sessions, GROUP, "order-1")
    assert [r.message_key for r in rows] == ["p1", "p2", "p3"]
    assert [(r.attempts, r.error) for r in rows] == [
        (3, "RuntimeError: cannot refund p1"),
        (0, None),
        (0, None),
    ]
    first = rows[0].message  # kept whole, for replay through the same listener
    assert first == msg("p1", "order-1")

    (event,) = events
    assert (event.group, event.topic, event.sharding_key, event.message_id) == (
        GROUP,
        TOPIC,
        "order-1",
        "msgid-p1",
    )
    assert (event.error, event.attempts, event.parked_at) == (
        "RuntimeError: cannot refund p1",
        3,
        key.parked_at,
    )
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    line = errors[0].getMessage()
    for part in (GROUP, TOPIC, "order-1", "msgid-p1", "cannot refund p1", "PARKED"):
        assert part in line
    assert replay_command(GROUP, "order-1") in line
    assert "txmsg parked retry" in line
    behind = [r.getMessage() for r in caplog.records if "message parked behind" in r.getMessage()]
    assert len(behind) == 2


def test_each_hook_runs_and_a_raising_hook_is_logged_not_raised(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    def broken_pager(event: ParkedEvent) -> None:
        raise ConnectionError("pager down")

    handle = spec_for(Recorder(poison={"p"}), sessions, retries=1).safe_handler(
        on_parked=[broken_pager, lambda e: seen.append(e.sharding_key)]
    )
    with caplog.at_level(logging.ERROR, logger="txmsg.orderly"):
        assert handle(msg("p", "order-9")) is True
    assert seen == ["order-9"]
    hook_logs = [r for r in caplog.records if "on_parked hook" in r.getMessage()]
    assert len(hook_logs) == 1
    assert hook_logs[0].exc_info is not None


def test_messages_without_a_sharding_key_share_the_empty_key(
    sessions: sessionmaker[Session],
) -> None:
    listener = Recorder(poison={"n1"})
    handle = spec_for(listener, sessions, retries=1).safe_handler()
    assert handle(msg("n1", None)) is True
    assert handle(msg("n2", None)) is True
    # the backend's property is used when the field is not filled
    via_property = Message(
        topic=TOPIC, body=b"", properties={UNIQ_KEY: "s1", SHARDING_KEY: "order-7"}
    )
    assert handle(via_property) is True
    assert [(k.sharding_key, k.messages) for k in parked_keys(sessions)] == [("", 2)]
    assert listener.handled == ["s1"]


def test_redelivered_parked_message_is_not_parked_twice(sessions: sessionmaker[Session]) -> None:
    listener = Recorder(poison={"p1"})
    handle = spec_for(listener, sessions, retries=2).safe_handler()
    for m in (msg("p1"), msg("p2"), msg("p1"), msg("p2"), msg("p3")):
        # the consumer "died" after parking p1 and p2, before the offsets were committed
        assert handle(m) is True
    assert [r.message_key for r in parked_messages(sessions, GROUP, "order-1")] == [
        "p1",
        "p2",
        "p3",
    ]
    assert listener.calls == ["p1", "p1"]


def test_orderly_with_idempotent_handler(sessions: sessionmaker[Session], engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE refund (uid TEXT PRIMARY KEY)"))

    def refund(message: Message, session: Session) -> None:
        uid = message.properties[UNIQ_KEY]
        session.execute(text("INSERT INTO refund (uid) VALUES (:u)"), {"u": uid})
        if uid == "bad":
            raise ValueError("liability not decided")

    handle = spec_for(refund, sessions, retries=2, idempotent=True).safe_handler()
    assert handle(msg("ok")) is True
    assert handle(msg("ok")) is True  # duplicate absorbed by the idempotent wrapper
    assert handle(msg("bad", "order-2")) is True  # parked; its insert rolled back
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT uid FROM refund"))] == ["ok"]
    assert [k.sharding_key for k in parked_keys(sessions)] == ["order-2"]


# ---- the database is unavailable: nothing is acknowledged ----------------------------------------
def test_database_down_before_the_check_returns_false(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = create_engine("sqlite://", poolclass=StaticPool)
    create_tables(engine)
    listener = Recorder()
    handle = spec_for(listener, make_session_factory(engine)).safe_handler()
    metadata.drop_all(engine)  # the database "fails" after the start
    with caplog.at_level(logging.ERROR, logger="txmsg.orderly"):
        assert handle(msg("a")) is False
    assert listener.calls == []  # not run: its key might be parked
    assert "handed again" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("journal", [False, True])
def test_missing_tables_are_refused_at_start_with_the_fix(journal: bool) -> None:
    engine = create_engine("sqlite://", poolclass=StaticPool)
    create_tables(engine)
    metadata.tables["txmsg_orderly_inflight"].drop(engine)  # a database from before the journal
    spec = spec_for(Recorder(), make_session_factory(engine))
    if not journal:
        spec.safe_handler()  # no journal: the parking tables are enough
        return
    with pytest.raises(
        ConfigError, match=r"txmsg_orderly_inflight missing .*txmsg.sqla.create_tables\(engine\)"
    ):
        spec.safe_handler(journal=True)


def test_an_in_memory_database_is_refused_for_the_journal(engine: Engine) -> None:
    # the sweeper thread would share the one connection with the consumer's threads
    spec = spec_for(Recorder(), make_session_factory(engine))
    with pytest.raises(ConfigError, match=r"in-memory SQLite .*sqlite:///orders.db"):
        spec.safe_handler(journal=True)
    spec.safe_handler()  # without the journal there is no thread of ours


def test_database_down_while_parking_returns_false_and_loses_nothing(
    sessions: sessionmaker[Session], engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    parked_table = metadata.tables["txmsg_parked_message"]

    class DropsTheTable(Recorder):
        def __call__(self, message: Message) -> None:
            parked_table.drop(engine, checkfirst=True)  # the database "fails" mid-way
            super().__call__(message)

    listener = DropsTheTable(poison={"p"})
    handle = spec_for(listener, sessions, retries=2).safe_handler(on_parked=[pytest.fail])
    with caplog.at_level(logging.ERROR, logger="txmsg.orderly"):
        assert handle(msg("p")) is False  # the backend suspends the queue and hands it again
    assert "could not park the key" in caplog.records[-1].getMessage()
    parked_table.create(engine)
    assert parked_keys(sessions) == []  # the key row rolled back with the message row

    events: list[ParkedEvent] = []
    listener = Recorder(poison={"p"})
    handle = spec_for(listener, sessions, retries=2).safe_handler(on_parked=[events.append])
    assert handle(msg("p")) is True  # handed again: parked this time
    assert [r.message_key for r in parked_messages(sessions, GROUP, "order-1")] == ["p"]
    assert len(events) == 1


def test_interrupt_is_not_the_messages_fault(sessions: sessionmaker[Session]) -> None:
    def interrupted(message: Message) -> None:
        raise KeyboardInterrupt

    handle = spec_for(interrupted, sessions).safe_handler()
    assert handle(msg("a")) is False
    assert parked_keys(sessions) == []
