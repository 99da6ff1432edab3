"""The after-sales sample without a broker: the service's events through txmsg's outbox (written
in each step's transaction; the relay sends them in order after the commit) and the settlement
rules."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from txmsg import ConfigError, Producer
from txmsg.errors import SendError
from txmsg.message import DEDUP_KEY, UNIQ_KEY, Message, OutgoingMessage, SendResult
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.outbox import Outbox, Relay, RetryPolicy
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.cases import (
    CLOSED,
    AfterSalesService,
    CasesBase,
    CaseStateError,
    case_status,
    events,
)
from txmsg_samples.aftersales.events import (
    CASE_CLOSED,
    LIABILITY_DECIDED,
    PRODUCER_GROUP,
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


class RecordingSender:
    """A plain-send client of our own for the relay (the broker tests use the real ones): keeps
    what it was handed, in order; ``fail`` makes the next sends fail the way a broker that is
    down does."""

    group = PRODUCER_GROUP

    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []
        self.fail = 0
        self.lock = threading.Lock()

    def send_async(self, message: OutgoingMessage) -> Future[SendResult]:
        future: Future[SendResult] = Future()
        with self.lock:
            if self.fail:
                self.fail -= 1
                future.set_exception(SendError("broker unreachable"))
                return future
            self.sent.append(message)
            future.set_result(SendResult(message_id=uuid.uuid4().hex, send_status="SEND_OK"))
        return future

    def send(self, message: OutgoingMessage) -> SendResult:
        return self.send_async(message).result()

    def send_oneway(self, message: OutgoingMessage) -> None:
        self.send(message)

    def send_batch(self, messages: object) -> SendResult:
        raise SendError("not used by the relay")

    def close(self, timeout: float | None = None) -> None:
        pass


@pytest.fixture
def cases_db(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'cases.db'}")
    CasesBase.metadata.create_all(engine)
    create_tables(engine)  # the outbox's tables
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def service(cases_db: sessionmaker[Session]) -> AfterSalesService:
    return AfterSalesService(Outbox(group=PRODUCER_GROUP, session_factory=cases_db), cases_db)


def written(service: AfterSalesService) -> list[Message]:
    """The messages in the outbox (not sent yet), each order's in ``seq`` order, as a consumer
    would get them (with the stable key the relay adds)."""
    return [
        Message(
            topic=row.message.topic,
            body=row.message.body,
            tags=row.message.tags,
            keys=row.message.keys,
            properties={UNIQ_KEY: uuid.uuid4().hex, DEDUP_KEY: row.message_key},
            sharding_key=row.sharding_key,
        )
        for row in service.outbox.rows()
    ]


@pytest.fixture
def settlement_db(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'settlement.db'}")
    SettlementBase.metadata.create_all(engine)
    create_tables(engine)
    yield make_session_factory(engine)
    engine.dispose()


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


def test_case_writes_its_events_in_order_in_each_steps_transaction(
    service: AfterSalesService, cases_db: sessionmaker[Session]
) -> None:
    service.open_case("c-1", "o-1", "m-1", 2_500)
    with pytest.raises(CaseStateError, match="RefundPaid needs it DECIDED"):
        service.pay_refund("c-1", "pay-1")  # the service itself never pays before deciding
    assert written(service) == []  # the refused step wrote nothing
    service.decide_liability("c-1", "merchant")
    service.pay_refund("c-1", "pay-1")
    service.close_case("c-1")
    assert case_status(cases_db, "c-1") == CLOSED
    messages = written(service)
    decoded = [AfterSalesEvent.from_body(m.body) for m in messages]
    assert [(e.kind, e.seq) for e in decoded] == [
        (LIABILITY_DECIDED, 1),
        (REFUND_PAID, 2),
        (CASE_CLOSED, 3),
    ]
    assert {(m.topic, m.sharding_key) for m in messages} == {(TOPIC, "o-1")}
    assert [m.tags for m in messages] == [e.kind for e in decoded]
    assert [m.keys for m in messages] == [e.event_id for e in decoded]
    assert [(e.seq, e.event_id) for e in events(cases_db, "o-1")] == [
        (e.seq, e.event_id) for e in decoded
    ]
    # a second case of the same order continues the order's counter
    service.open_case("c-2", "o-1", "m-1", 100)
    assert service.decide_liability("c-2", "platform").seq == 4


def test_the_relay_sends_an_orders_events_in_order_after_failures(
    service: AfterSalesService,
) -> None:
    """The broker is down for the first two sends: the steps commit anyway, the relay retries,
    and the order's events reach the broker in ``seq`` order."""
    service.open_case("c-1", "o-1", "m-1", 2_500)
    service.decide_liability("c-1", "platform")
    service.pay_refund("c-1", "pay-1")
    sender = RecordingSender()
    sender.fail = 2
    service.outbox.retry = RetryPolicy(max_attempts=5, first_delay=0, max_delay=0)
    relay = Relay(service.outbox, Producer(group=PRODUCER_GROUP, message_sender=sender))
    while relay.cycle():
        pass
    assert [AfterSalesEvent.from_body(m.body).seq for m in sender.sent] == [1, 2]
    assert [m.sharding_key for m in sender.sent] == ["o-1", "o-1"]
    assert service.outbox.stats().unsent == 0


def test_settlement_applies_in_order_and_skips_resends(
    service: AfterSalesService, settlement_db: sessionmaker[Session]
) -> None:
    with settlement_db() as s, s.begin():
        settlement.open_account(s, "m-1", 10_000)
    service.open_case("c-1", "o-1", "m-1", 2_500)
    service.decide_liability("c-1", "merchant")
    service.pay_refund("c-1", "pay-1")
    service.close_case("c-1")
    messages = written(service)
    for message in messages:
        apply(settlement_db, message)
    apply(settlement_db, messages[1])  # sent again (a relay died before marking it): skipped
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
    service: AfterSalesService, settlement_db: sessionmaker[Session]
) -> None:
    """The bug the sample is about: the refund consumed before the liability decision."""
    service.open_case("c-1", "o-1", "m-1", 2_500)
    service.decide_liability("c-1", "platform")
    service.pay_refund("c-1", "pay-1")
    decided, refunded = written(service)
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
    service: AfterSalesService, settlement_db: sessionmaker[Session]
) -> None:
    service.open_case("c-1", "o-1", "m-new", 2_500)
    service.decide_liability("c-1", "merchant")
    (decided,) = written(service)
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
