"""Issue 25, step 4: ``txmsg outbox status|list|retry|discard`` through the real ``txmsg`` command
group (entry point ``outbox`` in ``txmsg.commands``), against ``outbox_app.py`` (``--app``) or
the database (``--database``), on SQLite and PostgreSQL.  Rows die through a relay over a
scripted sender here; test_outbox_process.py replays a row that died on a real broker."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from click.testing import CliRunner, Result
from outbox_kit import ScriptedSender, scripted_producer

from conftest import Db
from txmsg.cli import main
from txmsg.errors import SendError
from txmsg.sqla.outbox import Relay

GROUP = "cli-outbox"


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["outbox", *args], catch_exceptions=False)


@pytest.fixture
def service(db: Db, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``outbox_app`` on the test's database, with two dead rows (keys a and b, a's later row
    waiting behind its dead one) and one unsent row."""
    monkeypatch.setenv("OUTBOX_APP_DB", db.url)
    if db.schema is not None:
        monkeypatch.setenv("OUTBOX_APP_SCHEMA", db.schema)
    monkeypatch.setenv("OUTBOX_APP_GROUP", GROUP)
    monkeypatch.setenv("OUTBOX_APP_ATTEMPTS", "1")
    sys.modules.pop("outbox_app", None)
    module = importlib.import_module("outbox_app")
    outbox = module.outbox
    for key, body in (("a", "a1"), ("a", "a2"), ("b", "b1"), (None, "p1")):
        with module.Session() as session, session.begin():
            outbox.send(session, "t", body, sharding_key=key)
    sender = ScriptedSender()
    sender.fail = lambda m: SendError("broker gone") if m.body in (b"a1", b"b1") else None
    Relay(outbox, scripted_producer(sender)).cycle()
    assert sender.bodies() == [b"p1"]
    with module.Session() as session, session.begin():  # one more unsent row of a fresh key
        outbox.send(session, "t", "c1", sharding_key="c")
    yield module
    module.engine.dispose()
    sys.modules.pop("outbox_app", None)


def ids_of(service: ModuleType) -> dict[str, int]:
    """Row id by body (SQLite may hand a deleted row's id out again: never hard-code them)."""
    return {row.message.body.decode(): row.id for row in service.outbox.rows()}


def test_status_counts_unsent_and_dead_rows(service: ModuleType, db: Db) -> None:
    out = run("status", "--app", "outbox_app:app")
    assert out.exit_code == 0, out.output
    (line,) = out.output.splitlines()
    assert f"{GROUP}  unsent=2" in line
    assert "dead=2" in line
    assert "txmsg outbox list --dead" in line
    as_json = json.loads(run("status", "--database", db.url_for_cli(), "--json").output)
    assert [(s["group"], s["unsent"], s["dead"]) for s in as_json] == [(GROUP, 2, 2)]
    assert as_json[0]["oldest_unsent_age_seconds"] >= 0


def test_list_shows_rows_in_send_order_and_dead_ones_alone(service: ModuleType) -> None:
    out = run("list", "--app", "outbox_app:app")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    ids = ids_of(service)
    assert [line.split()[0] for line in lines] == [f"#{ids[b]}" for b in ("a1", "a2", "b1", "c1")]
    assert "DEAD  key='a' seq=1" in lines[0]
    assert "SendError: broker gone" in lines[0]
    assert "PENDING  key='a' seq=2" in lines[1]
    dead = json.loads(run("list", "--app", "outbox_app:app", "--dead", "--json").output)
    assert [(d["id"], d["body"], d["attempts"]) for d in dead] == [
        (ids["a1"], "a1", 1),
        (ids["b1"], "b1", 1),
    ]
    keyed = json.loads(run("list", "--app", "outbox_app:app", "--key", "a", "--json").output)
    assert [k["body"] for k in keyed] == ["a1", "a2"]


def test_retry_makes_dead_rows_pending_and_a_relay_sends_them_in_order(
    service: ModuleType,
) -> None:
    assert run("retry", "--app", "outbox_app:app").exit_code == 2  # say which rows
    nothing = CliRunner().invoke(
        main, ["outbox", "retry", "--app", "outbox_app:app", "--id", "999"]
    )
    assert nothing.exit_code == 1
    assert "no dead row matches" in nothing.output
    out = run("retry", "--app", "outbox_app:app", "--key", "a")
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"retrying 1 row(s): #{ids_of(service)['a1']}.")
    sender = ScriptedSender()
    relay = Relay(service.outbox, scripted_producer(sender))
    relay.cycle()
    relay.cycle()
    assert [m.body for m in sender.sent if m.sharding_key == "a"] == [b"a1", b"a2"]
    assert b"b1" not in sender.bodies()  # still dead
    assert run("retry", "--app", "outbox_app:app", "--all").exit_code == 0
    relay.cycle()
    assert b"b1" in sender.bodies()


def test_discard_needs_yes_and_releases_the_keys_later_rows(service: ModuleType, db: Db) -> None:
    refused = CliRunner().invoke(main, ["outbox", "discard", "--app", "outbox_app:app", "--all"])
    assert refused.exit_code == 1
    assert "this deletes 2 dead row(s)" in refused.output
    a1 = ids_of(service)["a1"]
    out = run("discard", "--database", db.url_for_cli(), "--group", GROUP, "--id", str(a1), "--yes")
    assert out.exit_code == 0, out.output
    assert out.output.strip() == f"discarded 1 row(s): #{a1}"
    sender = ScriptedSender()
    Relay(service.outbox, scripted_producer(sender)).cycle()
    assert sorted(sender.bodies()) == [b"a2", b"c1"]  # a2 no longer waits; b1 is still dead


def test_usage_errors_say_what_to_give(service: ModuleType) -> None:
    neither = CliRunner().invoke(main, ["outbox", "status"])
    assert neither.exit_code == 2
    assert "--app MODULE:ATTR" in neither.output
    wrong = CliRunner().invoke(
        main, ["outbox", "status", "--app", "outbox_app:app", "--group", "x"]
    )
    assert wrong.exit_code == 1
    assert f"its outboxes: {GROUP}" in wrong.output
