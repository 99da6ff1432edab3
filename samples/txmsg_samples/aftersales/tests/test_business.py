"""The after-sales sample without a broker: the service's outbox and the settlement rules."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from txmsg import ConfigError
from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.cases import (
    CLOSED,
    AfterSalesService,
    CasesBase,
    CaseStateError,
    OutboxEvent,
    case_status,
)
from txmsg_samples.aftersales.events import (
    CASE_CLOSED,
    LIABILITY_DECIDED,
    REFUND_PAID,
    TOPIC,
    AfterSalesEvent,
)
from txmsg_samples.aftersales.settings import DEFAULT_PATH, load
from txmsg_samples.aftersales.settlement import (
    LiabilityNotDecided,
    MerchantAccount,
    OrderSettlement,
    OutOfOrder,
    SettlementBase,
    UnknownMerchant,
    on_aftersales_event,
)


@dataclass
class Sent:
    topic: str
    body: bytes
    sharding_key: str
    keys: str | None
    tags: str | None


@dataclass
class RecordingPublisher:
    """Stand-in for a txmsg Producer: keeps what ``send_orderly`` got; ``fail`` makes the next
    sends raise, the way a broker that is down does."""

    sent: list[Sent] = field(default_factory=list)
    fail: int = 0

    def send_orderly(
        self,
        topic: str,
        payload: Any,
        *,
        sharding_key: str,
        keys: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("broker unreachable")
        self.sent.append(Sent(topic, payload, sharding_key, keys, tags))


@pytest.fixture
def cases_db(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'cases.db'}")
    CasesBase.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def settlement_db(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'settlement.db'}")
    SettlementBase.metadata.create_all(engine)
    create_tables(engine)
    yield make_session_factory(engine)
    engine.dispose()


def as_message(sent: Sent) -> Message:
    return Message(
        topic=sent.topic,
        body=sent.body,
        tags=sent.tags,
        keys=sent.keys,
        properties={UNIQ_KEY: uuid.uuid4().hex},
        sharding_key=sent.sharding_key,
    )


def apply(db: sessionmaker[Session], message: Message) -> None:
    with db() as session, session.begin():
        on_aftersales_event(message, session)


def test_shipped_config_file_loads() -> None:
    config, settings = load(DEFAULT_PATH, env={})
    assert settings.max_orderly_retries == 3
    assert config.consumers["aftersales-settlement"].concurrency == 4
    config, _ = load(DEFAULT_PATH, env={"TXMSG_BACKEND": "rocketmq5", "TXMSG_ENDPOINTS": "h:1"})
    assert (config.backend, config.endpoints) == ("rocketmq5", "h:1")


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "txmsg.toml"
    bad.write_text('[aftersales]\nsettlement_dbb = "sqlite://"\n')
    with pytest.raises(ConfigError, match=r"aftersales\.settlement_dbb"):
        load(bad, env={})
    bad.write_text("[aftersales]\nmax_orderly_retries = 0\n")
    with pytest.raises(ConfigError, match=r"aftersales\.max_orderly_retries"):
        load(bad, env={})


def test_case_publishes_its_events_in_order(cases_db: sessionmaker[Session]) -> None:
    publisher = RecordingPublisher()
    service = AfterSalesService(publisher, cases_db)
    service.open_case("c-1", "o-1", "m-1", 2_500)
    with pytest.raises(CaseStateError, match="RefundPaid needs it DECIDED"):
        service.pay_refund("c-1", "pay-1")  # the service itself never pays before deciding
    service.decide_liability("c-1", "merchant")
    service.pay_refund("c-1", "pay-1")
    service.close_case("c-1")
    assert case_status(cases_db, "c-1") == CLOSED
    events = [AfterSalesEvent.from_body(s.body) for s in publisher.sent]
    assert [(e.kind, e.seq) for e in events] == [
        (LIABILITY_DECIDED, 1),
        (REFUND_PAID, 2),
        (CASE_CLOSED, 3),
    ]
    assert {(s.topic, s.sharding_key) for s in publisher.sent} == {(TOPIC, "o-1")}
    assert [s.tags for s in publisher.sent] == [e.kind for e in events]
    assert [s.keys for s in publisher.sent] == [e.event_id for e in events]
    # a second case of the same order continues the order's counter
    service.open_case("c-2", "o-1", "m-1", 100)
    assert service.decide_liability("c-2", "platform").seq == 4


def test_failed_send_stays_in_the_outbox_and_goes_later_in_order(
    cases_db: sessionmaker[Session],
) -> None:
    publisher = RecordingPublisher()
    service = AfterSalesService(publisher, cases_db)
    service.open_case("c-1", "o-1", "m-1", 2_500)
    publisher.fail = 2
    with pytest.raises(ConnectionError):
        service.decide_liability("c-1", "platform")  # committed; the send failed
    with pytest.raises(ConnectionError):
        service.pay_refund("c-1", "pay-1")  # committed too; publish tries seq 1 first and fails
    assert publisher.sent == []
    assert service.publish_pending() == 2
    assert [AfterSalesEvent.from_body(s.body).seq for s in publisher.sent] == [1, 2]
    assert service.publish_pending() == 0
    with cases_db() as s:
        assert all(row.sent_at is not None for row in s.scalars(select(OutboxEvent)))


def test_settlement_applies_in_order_and_skips_resends(
    cases_db: sessionmaker[Session], settlement_db: sessionmaker[Session]
) -> None:
    publisher = RecordingPublisher()
    service = AfterSalesService(publisher, cases_db)
    with settlement_db() as s, s.begin():
        settlement.open_account(s, "m-1", 10_000)
    service.open_case("c-1", "o-1", "m-1", 2_500)
    service.decide_liability("c-1", "merchant")
    service.pay_refund("c-1", "pay-1")
    service.close_case("c-1")
    messages = [as_message(s) for s in publisher.sent]
    for message in messages:
        apply(settlement_db, message)
    apply(settlement_db, as_message(publisher.sent[1]))  # the service sent it again: skipped
    with settlement_db() as s:
        assert [(e.seq, e.kind, e.party, e.amount_cents) for e in settlement.ledger(s)] == [
            (1, LIABILITY_DECIDED, "merchant", 0),
            (2, REFUND_PAID, "merchant", 2_500),
            (3, CASE_CLOSED, None, 0),
        ]
        account = s.get(MerchantAccount, "m-1")
        assert account is not None
        assert account.balance_cents == 7_500
        order = s.get(OrderSettlement, "o-1")
        assert order is not None
        assert (order.applied_seq, order.refunded_cents, order.closed_cases) == (3, 2_500, 1)


def test_out_of_order_events_are_refused(
    cases_db: sessionmaker[Session], settlement_db: sessionmaker[Session]
) -> None:
    """The bug the sample is about: the refund consumed before the liability decision."""
    publisher = RecordingPublisher()
    service = AfterSalesService(publisher, cases_db)
    service.open_case("c-1", "o-1", "m-1", 2_500)
    service.decide_liability("c-1", "platform")
    service.pay_refund("c-1", "pay-1")
    decided, refunded = (as_message(s) for s in publisher.sent)
    with pytest.raises(OutOfOrder, match="got RefundPaid seq 2 but applied only up to seq 0"):
        apply(settlement_db, refunded)
    # a refund event that claims to be the first: no decision to charge anyone by
    first = AfterSalesEvent.from_body(refunded.body)
    forged = Message(
        topic=TOPIC,
        body=AfterSalesEvent(**{**first.__dict__, "seq": 1}).body(),
        properties={UNIQ_KEY: "x"},
    )
    with pytest.raises(LiabilityNotDecided, match="paid before any liability decision"):
        apply(settlement_db, forged)
    with settlement_db() as s:
        assert settlement.ledger(s) == []  # each refusal rolled back
    apply(settlement_db, decided)
    apply(settlement_db, refunded)
    with settlement_db() as s:
        assert [e.kind for e in settlement.ledger(s)] == [LIABILITY_DECIDED, REFUND_PAID]


def test_poison_until_the_merchant_account_exists(
    cases_db: sessionmaker[Session], settlement_db: sessionmaker[Session]
) -> None:
    publisher = RecordingPublisher()
    service = AfterSalesService(publisher, cases_db)
    service.open_case("c-1", "o-1", "m-new", 2_500)
    service.decide_liability("c-1", "merchant")
    (decided,) = (as_message(s) for s in publisher.sent)
    for _ in range(2):
        with pytest.raises(UnknownMerchant, match="merchant m-new has no settlement account"):
            apply(settlement_db, decided)
    with settlement_db() as s, s.begin():
        settlement.open_account(s, "m-new")
    apply(settlement_db, decided)
    with settlement_db() as s:
        assert [e.party for e in settlement.ledger(s)] == ["merchant"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "not an after-sales event"),
        (b'{"event_id": "e"}', "not an after-sales event"),
        (
            AfterSalesEvent("e", "Shipped", "o", "c", 1, "m").body(),
            "unknown after-sales event kind 'Shipped'",
        ),
        (AfterSalesEvent("e", CASE_CLOSED, "o", "c", 0, "m").body(), "seq must be >= 1"),
    ],
)
def test_malformed_events_are_refused(body: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        AfterSalesEvent.from_body(body)
