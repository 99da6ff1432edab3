"""``txmsg parked list|retry|discard`` through the real ``txmsg`` command group (entry point
``parked`` in ``txmsg.commands``), against an application module written for the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from txmsg import cli_targets
from txmsg.cli import main
from txmsg.message import UNIQ_KEY, Message
from txmsg.parked_cli import load_app
from txmsg.sqla import create_engine

APP_SOURCE = """
import os

import txmsg
from txmsg.consumer import build_consumer_spec
from txmsg.sqla import create_engine, create_tables, make_session_factory

engine = create_engine(os.environ["PARKED_CLI_DB"])
create_tables(engine)
Session = make_session_factory(engine)
BROKEN = {"p1"} if os.environ.get("PARKED_CLI_BROKEN") else set()
handled = []


def refund(message):
    uid = message.properties["UNIQ_KEY"]
    if uid in BROKEN:
        raise RuntimeError(uid + " is poison")
    handled.append(uid)


def points(message):
    pass


app = txmsg.TxMsg(txmsg.TxMsgConfig())
app.registry.add_consumer(
    build_consumer_spec(
        refund, topic="after-sales", group="refund-consumer", orderly=True,
        max_orderly_retries=1, orderly_retry_delay=0, session_factory=Session,
    )
)
app.registry.add_consumer(build_consumer_spec(points, topic="after-sales", group="points"))


def create_app():
    return app
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A project directory with ``parked_app.py`` (an app with one orderly and one concurrent
    listener) whose database already holds parked messages; yields the database URL."""
    name = f"parked_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP_SOURCE))
    url = f"sqlite:///{tmp_path / 'service.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app adds the cwd: undone afterwards
    monkeypatch.setenv("PARKED_CLI_DB", url)
    monkeypatch.setenv("PARKED_CLI_BROKEN", "1")
    monkeypatch.setenv("PARKED_APP", name)
    app = load_app(f"{name}:app")  # imports the module from the current directory, like flask
    handle = app.registry.consumers["refund-consumer"].safe_handler()
    for uid, key in (("p1", "order-1"), ("x", "order-2"), ("p2", "order-1"), ("p3", "order-1")):
        message = Message(
            topic="after-sales",
            body=uid.encode(),
            properties={UNIQ_KEY: uid},
            message_id=f"id-{uid}",
            sharding_key=key,
        )
        assert handle(message) is True
    yield url
    sys.modules.pop(name, None)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["parked", *args], catch_exceptions=False)


def app_ref(attr: str = "app") -> str:
    return f"{os.environ['PARKED_APP']}:{attr}"


def test_list_keys_and_messages(project: str) -> None:
    out = run("list", "--app", app_ref())
    assert out.exit_code == 0, out.output
    (line,) = out.output.splitlines()
    assert "refund-consumer" in line
    assert "key='order-1'" in line
    assert "messages=3" in line
    assert "RuntimeError: p1 is poison" in line

    by_url = run("list", "--database", project, "--json")
    assert by_url.exit_code == 0, by_url.output
    (key,) = json.loads(by_url.output)
    assert (key["group"], key["sharding_key"], key["messages"]) == ("refund-consumer", "order-1", 3)

    messages = run("list", "--app", app_ref("create_app"), "--key", "order-1", "--json")
    assert messages.exit_code == 0, messages.output
    rows = json.loads(messages.output)
    assert [(r["message_key"], r["body"], r["attempts"]) for r in rows] == [
        ("p1", "p1", 1),
        ("p2", "p2", 0),
        ("p3", "p3", 0),
    ]
    text = run("list", "--database", project, "--key", "order-1")
    assert [line.split()[3] for line in text.output.splitlines()] == [
        "message=p1",
        "message=p2",
        "message=p3",
    ]


def test_clear_errors(project: str) -> None:
    cases = {
        ("list",): "--app MODULE:ATTR",
        ("list", "--app", app_ref(), "--database", project): "not both",
        ("list", "--app", app_ref(), "--group", "nope"): "no message listener of group 'nope'",
        ("list", "--app", app_ref(), "--group", "points"): "is not an orderly listener",
        ("list", "--app", "no_such_module_xyz:app"): "cannot import no_such_module_xyz",
        ("list", "--app", app_ref("handled")): "not a txmsg.TxMsg",
        ("list", "--database", project, "--key", "order-9"): "key 'order-9' is not parked",
        ("retry", "--app", app_ref(), "--key", "order-9"): "key 'order-9' is not parked",
        ("discard", "--database", project, "--group", "refund-consumer", "--key", "order-1"): (
            "add --yes"
        ),
        ("discard", "--database", project, "--group", "g", "--key", "order-1", "--yes"): (
            "is not parked in group 'g'"
        ),
        ("list", "--database", "sqlite:///" + str(Path(project[10:]).parent / "empty.db")): (
            "txmsg.sqla.create_tables"
        ),
    }
    for args, expected in cases.items():
        result = CliRunner().invoke(main, ["parked", *args])
        assert result.exit_code != 0, (args, result.output)
        assert expected in result.output, (args, result.output)


def test_replay_fails_again_then_succeeds(project: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the module is still the broken release: replay fails again and keeps the key parked
    again = CliRunner().invoke(main, ["parked", "retry", "--app", app_ref()])
    assert again.exit_code == 1
    assert "failed again (RuntimeError: p1 is poison)" in again.output
    assert "still parked" in again.output
    rows = json.loads(run("list", "--database", project, "--key", "order-1", "--json").output)
    assert rows[0]["attempts"] == 2

    import importlib  # noqa: PLC0415

    module = sys.modules[os.environ["PARKED_APP"]]
    monkeypatch.delenv("PARKED_CLI_BROKEN")
    importlib.reload(module)  # the fixed release
    fixed = run("retry", "--app", app_ref(), "--group", "refund-consumer")
    assert fixed.exit_code == 0, fixed.output
    assert "key='order-1': replayed 3, released" in fixed.output
    assert module.handled == ["p1", "p2", "p3"]
    assert run("list", "--app", app_ref()).output.strip() == "nothing parked"
    assert run("retry", "--app", app_ref()).output.strip() == "nothing parked"


def test_discard_one_message_then_the_key(project: str) -> None:
    base = ("discard", "--database", project, "--group", "refund-consumer", "--key", "order-1")
    one = run(*base, "--message", "p1", "--yes")
    assert one.exit_code == 0, one.output
    assert "discarded 1; 2 still parked" in one.output
    rest = run(*base, "--yes")
    assert "discarded 2; key released" in rest.output
    assert run("list", "--database", project).output.strip() == "nothing parked"


def test_installed_command_lists_parked_keys(project: str) -> None:
    """The console script finds `parked` through its entry point (a subprocess, as an operator
    runs it)."""
    txmsg = Path(sys.executable).with_name("txmsg")
    done = subprocess.run(
        [str(txmsg), "parked", "list", "--database", project, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [k["sharding_key"] for k in json.loads(done.stdout)] == ["order-1"]


def test_database_engine_is_disposed(project: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--database`` makes an engine for one command: its pooled connections are closed when
    the command ends, also when it fails (a CLI embedded in a long-lived process must not leak
    them)."""
    made: list[Any] = []

    def tracking_engine(url: str) -> Any:
        engine = create_engine(url)
        made.append(engine)
        return engine

    monkeypatch.setattr(cli_targets, "create_engine", tracking_engine)
    disposed: list[Any] = []
    monkeypatch.setattr(
        "sqlalchemy.engine.Engine.dispose", lambda self, close=True: disposed.append(self)
    )
    assert run("list", "--database", project).exit_code == 0
    assert run("list", "--database", project, "--key", "order-9").exit_code != 0
    assert len(made) == 2
    assert disposed == made
