"""The transactional outbox: messages committed with the business change, sent by a relay.

:class:`Outbox` (declared with :meth:`txmsg.TxMsg.add_outbox`) writes rows in the caller's
transaction; :class:`Relay` sends them after the commit.  Modules, one job each:

* :mod:`~txmsg.sqla.outbox.models` - the tables (created by :func:`txmsg.sqla.create_tables`);
* :mod:`~txmsg.sqla.outbox.writer` - validating and numbering a row in the caller's transaction;
* :mod:`~txmsg.sqla.outbox.store` - the relay's and the operator's queries;
* :mod:`~txmsg.sqla.outbox.relay` - the relay thread and its cycle;
* :mod:`~txmsg.sqla.outbox.claims` - how a relay claims rows in PostgreSQL (row locks) or SQLite
  (a lease);
* :mod:`~txmsg.sqla.outbox.ledger` - SQLite: sent rows the next writer's transaction deletes;
* :mod:`~txmsg.sqla.outbox.policy` - back-off and which errors are final;
* :mod:`~txmsg.sqla.outbox.wheel` - the time wheel of rows in back-off.

The guide: docs/guide/outbox.md.
"""

from txmsg.sqla.outbox.models import OutboxKey, OutboxMessage, OutboxRelayLease, OutboxState
from txmsg.sqla.outbox.outbox import Outbox, OutboxStats
from txmsg.sqla.outbox.policy import RetryPolicy, is_permanent
from txmsg.sqla.outbox.relay import OutboxDeadEvent, OutboxSender, Relay, RelayStats
from txmsg.sqla.outbox.store import Backlog, OutboxRowView, backlogs, purge_idle_keys, rows
from txmsg.sqla.outbox.wheel import TimeWheel
from txmsg.sqla.outbox.writer import OutboxReceipt

__all__ = [
    "Backlog",
    "Outbox",
    "OutboxDeadEvent",
    "OutboxKey",
    "OutboxMessage",
    "OutboxReceipt",
    "OutboxRelayLease",
    "OutboxRowView",
    "OutboxSender",
    "OutboxState",
    "OutboxStats",
    "Relay",
    "RelayStats",
    "RetryPolicy",
    "TimeWheel",
    "backlogs",
    "is_permanent",
    "purge_idle_keys",
    "rows",
]
