"""SQLAlchemy integration: local transactions with transaction records, record-backed check-backs,
idempotent consumers, parked keys of orderly consumers (:mod:`txmsg.sqla.parking`), the
transactional outbox (:mod:`txmsg.sqla.outbox`).

Quick start::

    engine = txmsg.sqla.create_engine("sqlite:///var/orders.db")
    txmsg.sqla.create_tables(engine)          # next to your own metadata.create_all(engine)
    Session = txmsg.sqla.make_session_factory(engine)

    @app.transactional_listener(group="order-tx")
    class PayOrder(txmsg.sqla.RecordBackedListener):
        def execute_in_transaction(self, session, message, arg):
            ...                               # business change; raise to roll back

Isolation: SQLite in WAL mode with ``BEGIN IMMEDIATE`` writers, PostgreSQL at READ COMMITTED (see
:mod:`txmsg.sqla.engine`).
"""

from txmsg.errors import TransactionFencedError
from txmsg.sqla import discarded as _discarded_models  # noqa: F401 - its table, likewise
from txmsg.sqla.check import BORN_PROPERTY, RecordCheck, born_properties, message_born_at
from txmsg.sqla.engine import (
    SessionFactory,
    create_engine,
    make_session_factory,
    read_only,
)
from txmsg.sqla.idempotent import (
    IdempotentConsumer,
    consumed_count,
    duplicates_absorbed,
    purge_consumed,
    wrap_idempotent,
)
from txmsg.sqla.listener import RecordBackedListener
from txmsg.sqla.local import SqlAlchemyLocalTransaction, listener_group, transactional
from txmsg.sqla.models import (
    ConsumedMessage,
    ConsumeStat,
    OrderlyInflight,
    ParkedKey,
    ParkedMessage,
    RecordState,
    TransactionRecord,
    TransactionRecordArchive,
    create_tables,
    metadata,
)

# the outbox's tables join txmsg's metadata here, so create_tables() and Alembic see them
from txmsg.sqla.outbox import models as _outbox_models  # noqa: F401
from txmsg.sqla.parking import (
    ParkedKeyView,
    ParkedMessageView,
    ReplayReport,
    discard,
    parked_keys,
    parked_messages,
    replay,
)
from txmsg.sqla.records import (
    MIN_RETENTION,
    RecordView,
    count_records,
    get_record,
    purge_records,
)

__all__ = [
    "BORN_PROPERTY",
    "MIN_RETENTION",
    "ConsumeStat",
    "ConsumedMessage",
    "IdempotentConsumer",
    "OrderlyInflight",
    "ParkedKey",
    "ParkedKeyView",
    "ParkedMessage",
    "ParkedMessageView",
    "RecordBackedListener",
    "RecordCheck",
    "RecordState",
    "RecordView",
    "ReplayReport",
    "SessionFactory",
    "SqlAlchemyLocalTransaction",
    "TransactionFencedError",
    "TransactionRecord",
    "TransactionRecordArchive",
    "born_properties",
    "consumed_count",
    "count_records",
    "create_engine",
    "create_tables",
    "discard",
    "duplicates_absorbed",
    "get_record",
    "listener_group",
    "make_session_factory",
    "message_born_at",
    "metadata",
    "parked_keys",
    "parked_messages",
    "purge_consumed",
    "purge_records",
    "read_only",
    "replay",
    "transactional",
    "wrap_idempotent",
]
