"""``txmsg discarded list|retry|discard`` (issue 39.5): the dead rows the rescuer left behind.

Rows are written the way the rescuer writes them (``SqlDeadStore.add`` with a
``DiscardedEvent``); ``rescue`` runs against the embedded broker with the app's own listener and
backend, and a consumer sees what it sent.
"""

from __future__ import annotations

import json
import queue
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from txmsg_broker.testing import create_topic

from txmsg import Message, TxMsg, TxMsgConfig, sqla
from txmsg.cli import main
from txmsg.message import DEDUP_KEY, UNIQ_KEY
from txmsg.rescue import RESCUED_PROPERTY, DiscardedEvent
from txmsg.sqla.discarded import SqlDeadStore, dead_rows


def database(tmp_path: Path) -> tuple[str, Any]:
    url = f"sqlite:///{tmp_path / 'service.db'}"
    engine = sqla.create_engine(url)
    sqla.create_tables(engine)
    return url, engine


def dead(sessions: Any, key: str, topic: str = "cli-orders", group: str = "cli-tx") -> None:
    message = Message(
        topic=topic,
        body=json.dumps({"order": key}).encode(),
        tags="paid",
        keys=f"order-{key}",
        properties={UNIQ_KEY: key, "tenant": "acme", "REAL_TOPIC": topic, "PGROUP": group},
        message_id=key,
    )
    event = DiscardedEvent(
        group=group,
        topic=topic,
        transaction_key=key,
        message=message,
        attempts=16,
        reason="check_local gave no answer",
    )
    assert SqlDeadStore(sessions).add(event) is True


def test_list_and_drop_by_database(tmp_path: Path) -> None:
    url, engine = database(tmp_path)
    sessions = sqla.make_session_factory(engine)
    dead(sessions, "K1")
    dead(sessions, "K2")
    dead(sessions, "K2")  # discarded twice (a re-put copy): still one row
    runner = CliRunner()
    listed = runner.invoke(main, ["discarded", "list", "--database", url, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [r["transaction_key"] for r in rows] == ["K1", "K2"]
    assert rows[0]["topic"] == "cli-orders"
    assert rows[0]["properties"]["tenant"] == "acme"
    assert rows[1]["attempts"] == 32
    text = runner.invoke(main, ["discarded", "list", "--database", url, "--group", "cli-tx"])
    assert "key=K1" in text.output
    refused = runner.invoke(
        main, ["discarded", "discard", "--database", url, "--group", "cli-tx", "--key", "K1"]
    )
    assert refused.exit_code != 0
    assert "--yes" in refused.output
    dropped = runner.invoke(
        main,
        ["discarded", "discard", "--database", url, "--group", "cli-tx", "--key", "K1", "--yes"],
    )
    assert dropped.exit_code == 0, dropped.output
    assert [r.transaction_key for r in dead_rows(sessions, "cli-tx")] == ["K2"]
    engine.dispose()


APP_MODULE = """
from txmsg import LocalTransactionState, TxMsg, TxMsgConfig
from txmsg import sqla

engine = sqla.create_engine({url!r})
sessions = sqla.make_session_factory(engine)
app = TxMsg(TxMsgConfig(name_server={namesrv!r}, client_log_dir={logs!r}))

COMMITTED = {{"K1"}}
ROLLED_BACK = {{"K2"}}


@app.transactional_listener(group="cli-tx", topics=["cli-orders"])
class Orders:
    session_factory = sessions

    def execute_local(self, message, arg):
        return LocalTransactionState.COMMIT

    def check_local(self, message):
        key = message.transaction_key
        if key in COMMITTED:
            return LocalTransactionState.COMMIT
        if key in ROLLED_BACK:
            return LocalTransactionState.ROLLBACK
        return LocalTransactionState.UNKNOW
"""


def test_retry_asks_check_local_again_and_sends_the_committed(
    tmp_path: Path, txmsg_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, engine = database(tmp_path)
    sessions = sqla.make_session_factory(engine)
    for key in ("K1", "K2", "K3"):
        dead(sessions, key)
    create_topic(txmsg_broker.namesrv_addr, "cli-orders")
    module = tmp_path / "cli_service.py"
    module.write_text(
        textwrap.dedent(
            APP_MODULE.format(
                url=url, namesrv=txmsg_broker.namesrv_addr, logs=str(tmp_path / "client-logs")
            )
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    received: queue.Queue[Message] = queue.Queue()
    consumer = TxMsg(
        TxMsgConfig(
            name_server=txmsg_broker.namesrv_addr, client_log_dir=str(tmp_path / "client-logs")
        )
    )
    consumer.add_message_listener(received.put, topic="cli-orders", group="cli-points")
    with consumer:
        result = CliRunner().invoke(
            main, ["discarded", "retry", "--app", "cli_service:app", "--group", "cli-tx"]
        )
        assert result.exit_code == 1, result.output  # K3 has no answer yet: kept
        assert "K1: sent to cli-orders; row deleted" in result.output
        assert "K2: rolled back: nothing to send; row deleted" in result.output
        assert "K3: check_local still answers UNKNOW; kept" in result.output
        message = received.get(timeout=30)
        assert message.json() == {"order": "K1"}
        assert message.transaction_key == "K1"
        assert message.properties[DEDUP_KEY] == "K1"
        assert message.properties[RESCUED_PROPERTY] == "K1"
        assert message.properties["tenant"] == "acme"
        assert [r.transaction_key for r in dead_rows(sessions, "cli-tx")] == ["K3"]
        forced = CliRunner().invoke(
            main,
            ["discarded", "retry", "--app", "cli_service:app", "--group", "cli-tx", "--force"],
        )
        assert forced.exit_code == 0, forced.output
        assert received.get(timeout=30).json() == {"order": "K3"}
    assert dead_rows(sessions, "cli-tx") == []
    sys.modules.pop("cli_service", None)
    engine.dispose()
