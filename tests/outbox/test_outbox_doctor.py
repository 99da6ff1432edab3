"""Issue 25: ``txmsg doctor`` shows each outbox's unsent rows, the oldest one's age and dead rows
of the configured ``[sqlalchemy] url``; dead or stale rows are (advisory) FAIL rows."""

from __future__ import annotations

import importlib.metadata
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from outbox_kit import ScriptedSender, scripted_producer

from conftest import Db
from txmsg import TxMsgConfig
from txmsg.cli import main
from txmsg.errors import SendError
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox import Outbox, OutboxMessage, Relay, RetryPolicy
from txmsg.sqla.outbox.doctor import report


def config(url: str | None) -> TxMsgConfig:
    return TxMsgConfig(sqlalchemy={"url": url})


def test_the_check_is_registered_and_says_when_there_is_nothing_to_read(tmp_path: Path) -> None:
    names = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="txmsg.doctor_checks")
    }
    assert names["outbox"] == "txmsg.sqla.outbox.doctor:report"
    ((label, detail, ok),) = report(config(None))
    assert (label, ok) == ("outbox", True)
    assert "no [sqlalchemy] url" in detail
    ((_, detail, ok),) = report(config(f"sqlite:///{tmp_path / 'other.db'}"))
    assert ok
    assert "no outbox table" in detail


def test_dead_and_stale_rows_are_advisory_failures(db: Db) -> None:
    outbox = Outbox(
        group="doctor-outbox", session_factory=db.sessions, retry=RetryPolicy(max_attempts=1)
    )
    url = db.url_for_cli()
    ((_, detail, ok),) = report(config(url))
    assert (detail, ok) == ("empty: every row sent", True)
    for body in ("a1", "a2"):
        with db.sessions() as session, session.begin():
            outbox.send(session, "t", body, sharding_key="a")
    ((label, detail, ok),) = report(config(url))
    assert (label, ok) == ("outbox doctor-outbox", True)
    assert detail.startswith("unsent 2, oldest ")
    sender = ScriptedSender()
    sender.fail = lambda m: SendError("down")
    Relay(outbox, scripted_producer(sender)).cycle()
    ((_, detail, ok),) = report(config(url))
    assert not ok
    assert "dead 1" in detail
    assert "txmsg outbox list --dead --group doctor-outbox" in detail
    with db.sessions() as session, session.begin():  # a relay that stopped long ago
        session.execute(
            OutboxMessage.__table__.update().values(created_at=utcnow() - timedelta(minutes=5))
        )
    ((_, detail, ok),) = report(config(url))
    assert "is its relay running?" in detail


def test_txmsg_doctor_prints_the_outbox_rows(
    db: Db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TXMSG_CONFIG", raising=False)
    outbox = Outbox(group="doctor-outbox", session_factory=db.sessions)
    with db.sessions() as session, session.begin():
        outbox.send(session, "t", b"x")
    result = CliRunner().invoke(
        main,
        ["doctor"],
        env={"TXMSG_SQLALCHEMY__URL": db.url_for_cli(), "TXMSG_NAME_SERVER": "127.0.0.1:1"},
    )
    assert result.exit_code == 0, result.output
    assert "outbox checks" in result.output
    assert "outbox doctor-outbox  unsent 1, oldest" in result.output
