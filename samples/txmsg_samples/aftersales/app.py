"""Wire the after-sales sample: two services, two databases, two txmsg apps.

* the **after-sales service** (:func:`aftersales_app`): a transactional outbox
  (``app.add_outbox``) in the cases database; each step's event is written in the step's own
  transaction and the outbox's relay publishes it with ``send_orderly`` (an order's events to one
  queue, in commit order);
* the **settlement service** (:func:`settlement_app`): the orderly, idempotent listener, its
  alert hook (``app.on_parked``), parked messages in its own database.

They run in separate processes in production (and in the kill test); nothing here depends on
sharing one.  ``txmsg parked list|retry --app txmsg_samples.aftersales.app:create_app`` finds the
settlement service's database and handler through :func:`create_app`.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from txmsg import TxMsg, TxMsgConfig
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.cases import AfterSalesService, CasesBase
from txmsg_samples.aftersales.events import PRODUCER_GROUP, TOPIC
from txmsg_samples.aftersales.settings import AfterSalesSettings, load

if TYPE_CHECKING:
    from txmsg.orderly import ParkedEvent

log = logging.getLogger("txmsg_samples.aftersales")


def open_db(url: str, base: type[CasesBase] | type[settlement.SettlementBase]) -> Engine:
    """An engine with the service's tables and txmsg's (dedup rows, parked messages) created."""
    engine = create_engine(url)
    base.metadata.create_all(engine)
    create_tables(engine)
    return engine


@dataclass
class ParkedAlerts:
    """The alert hook of the settlement service: every parked order is logged, kept in
    :attr:`events` and (with ``file``) appended to a JSON-lines file - put your pager here.

    txmsg calls it in the consumer thread right after the park committed; whatever it raises is
    logged and ignored, so a broken pager never blocks the queue."""

    file: str | None = None
    events: list[ParkedEvent] = field(default_factory=list)
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def __call__(self, event: ParkedEvent) -> None:
        log.error(
            "order %s parked in %s after %d attempts (%s); fix the cause, then run: "
            "txmsg parked retry --app txmsg_samples.aftersales.app:create_app --group %s --key %s",
            event.sharding_key,
            event.group,
            event.attempts,
            event.error,
            event.group,
            event.sharding_key,
        )
        with self._lock:
            self.events.append(event)
            if self.file:
                path = Path(self.file)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(event), default=str) + "\n")


def aftersales_app(
    config: TxMsgConfig, cases_db: sessionmaker[Session], *, relay: bool = True
) -> TxMsg:
    """The after-sales service's app (not started): the outbox of producer group
    ``PRODUCER_GROUP`` in the cases database, its relay started with the app (``relay=False``:
    the relay runs elsewhere, ``txmsg outbox relay --app ...``)."""
    app = TxMsg(config)
    app.add_outbox(group=PRODUCER_GROUP, session_factory=cases_db, relay=relay)
    return app


def aftersales_service(app: TxMsg, cases_db: sessionmaker[Session]) -> AfterSalesService:
    """The service, writing its events through the app's outbox."""
    return AfterSalesService(app.outboxes[PRODUCER_GROUP], cases_db)


def settlement_app(
    config: TxMsgConfig,
    settings: AfterSalesSettings,
    settlement_db: sessionmaker[Session],
    alerts: ParkedAlerts | None = None,
) -> TxMsg:
    """The settlement service's app (not started): the orderly listener and its alert hook."""
    app = TxMsg(config)
    app.add_message_listener(
        settlement.on_aftersales_event,
        topic=TOPIC,
        group=settlement.GROUP,
        orderly=True,  # one message at a time per queue, in order
        idempotent=True,  # effects + dedup row in one transaction: replay applies once
        session_factory=settlement_db,  # also where parked messages are kept
        max_orderly_retries=settings.max_orderly_retries,
        orderly_retry_delay=settings.orderly_retry_delay,
    )
    app.on_parked(alerts if alerts is not None else ParkedAlerts(settings.alerts_file))
    return app


def create_app() -> TxMsg:
    """The settlement service from the config file (``$TXMSG_CONFIG`` or the sample's own):
    what ``txmsg parked ... --app txmsg_samples.aftersales.app:create_app`` loads."""
    config, settings = load()
    engine = open_db(settings.settlement_db, settlement.SettlementBase)
    return settlement_app(config, settings, make_session_factory(engine))
