"""``txmsg doctor``'s outbox rows (entry point ``outbox`` in ``txmsg.doctor_checks``, always run).

Why in the doctor: an outbox fails quietly - a relay that does not run, or rows dead after their
last attempt, show up nowhere but in the service's database.  With ``[sqlalchemy] url`` configured
(``TXMSG_SQLALCHEMY__URL``) the doctor reads the outbox table there and reports each outbox's
unsent rows, the oldest one's age and its dead rows; dead rows, or an unsent row older than
:data:`STALE_AFTER`, are FAIL rows (advisory: ``--strict`` makes them fail the run).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect

from txmsg.sqla.engine import create_engine, make_session_factory
from txmsg.sqla.outbox.models import OutboxMessage
from txmsg.sqla.outbox.store import backlogs

STALE_AFTER = 60.0
"""Seconds after which an unsent row means the relay is not keeping up, or not running."""

Check = tuple[str, str, bool]


def report(config: Any) -> list[Check]:
    """Rows for ``txmsg doctor`` (see the module docstring)."""
    url = getattr(getattr(config, "sqlalchemy", None), "url", None)
    if not url:
        return [
            (
                "outbox",
                "no [sqlalchemy] url configured, so no outbox to look at (`txmsg outbox status "
                "--app MODULE:ATTR` reads your app's)",
                True,
            )
        ]
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table(OutboxMessage.__tablename__):
                return [("outbox", "no outbox table in the configured database (not used)", True)]
        rows: list[Check] = []
        for backlog in backlogs(make_session_factory(engine)):
            age = backlog.oldest_unsent_age()
            stale = age is not None and age > STALE_AFTER
            detail = (
                f"unsent {backlog.unsent}, oldest {'-' if age is None else f'{age:.0f} s'}, "
                f"dead {backlog.dead}"
            )
            if backlog.dead:
                detail += f"; see `txmsg outbox list --dead --group {backlog.group}`, then retry"
            if stale:
                detail += "; is its relay running? (`txmsg outbox status` shows its lease)"
            rows.append((f"outbox {backlog.group}", detail, not backlog.dead and not stale))
        return rows or [("outbox", "empty: every row sent", True)]
    except Exception as exc:  # noqa: BLE001 - a finding, not a crash of the doctor
        return [("outbox", f"could not read the outbox: {type(exc).__name__}: {exc}", False)]
    finally:
        engine.dispose()
