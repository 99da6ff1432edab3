"""txmsg's ``access_key``/``secret_key`` against a broker with RocketMQ 4.9 ACL (issue 16.3): read from
the environment (TXMSG_ACCESS_KEY / TXMSG_SECRET_KEY), every native client signs (producers, their
keepers, consumers, the announcer), so an app sends a transaction, gets its check-back and consumes;
wrong keys get nothing through; ``txmsg doctor`` never prints the secret; the demo ends CONSISTENT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rmq_helpers import unique, wait_until
from txmsg_broker.testing import create_topic, read_log

from txmsg import ListenerRegistry, LocalTransactionState, Message, TxMsg
from txmsg.cli import main
from txmsg.config import resolve_config
from txmsg.errors import SendError

S = LocalTransactionState
REPO = Path(__file__).resolve().parents[2]
ADMIN = ("txmsg-acl-admin", "acl-admin-secret")
APP = ("txmsg-acl-app", "acl-app-secret-42")
ACL: dict[str, Any] = {
    "accounts": [
        {"accessKey": ADMIN[0], "secretKey": ADMIN[1], "admin": True},
        # what a txmsg app needs: PUB|SUB on its topics (SUB: the announcer's heartbeat subscribes)
        # and SUB on its groups (consumer groups, %RETRY%, TXMSG_ANNOUNCE_<producer group>)
        {
            "accessKey": APP[0],
            "secretKey": APP[1],
            "defaultTopicPerm": "PUB|SUB",
            "defaultGroupPerm": "SUB",
        },
    ],
}


@pytest.fixture
def acl_broker(txmsg_broker_factory: Any) -> Any:
    return txmsg_broker_factory(acl=ACL)


@pytest.fixture
def keys_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXMSG_ACCESS_KEY", APP[0])
    monkeypatch.setenv("TXMSG_SECRET_KEY", APP[1])


def _app(broker: Any, tmp_path: Path, registry: ListenerRegistry) -> TxMsg:
    config, _ = resolve_config(
        env={
            **os.environ,
            "TXMSG_NAME_SERVER": broker.namesrv_addr,
            "TXMSG_CLIENT_LOG_DIR": str(tmp_path / "client-logs"),
            "TXMSG_INSTANCE_PREFIX": "acl",
        }
    )
    app = TxMsg(config, backend="rocketmq")
    app.include(registry)
    return app


def test_app_with_keys_from_the_environment_commits_after_check_back_and_consumes(
    acl_broker: Any, tmp_path: Path, keys_in_env: None
) -> None:
    topic, group, consumer_group = unique("acl_topic"), unique("acl_pg"), unique("acl_cg")
    create_topic(acl_broker.namesrv_addr, topic, message_type="TRANSACTION", credentials=ADMIN)
    registry = ListenerRegistry()
    checked: list[bytes] = []
    received: list[bytes] = []

    @registry.transactional_listener(group=group, topics=[topic])
    class Pay:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW  # decided by the broker's check-back

        def check_local(self, message: Message) -> S:
            checked.append(message.body)
            return S.COMMIT

    registry.add_message_listener(
        lambda m: received.append(m.body), topic=topic, group=consumer_group
    )
    app = _app(acl_broker, tmp_path, registry)
    assert app.config.access_key == APP[0]
    with app:
        result = app.producer(group).send_in_transaction(topic, b"paid-with-acl")
        assert result.local_state == S.UNKNOW
        wait_until(
            lambda: received == [b"paid-with-acl"], timeout=60, message="the checked-back delivery"
        )
    assert b"paid-with-acl" in checked
    refused = [
        line for line in read_log(acl_broker.log_dir, "broker.log").splitlines() if "(ACL)" in line
    ]
    assert refused == []  # every client of the app signed, nothing was refused


def test_app_with_a_wrong_secret_gets_nothing_through(
    acl_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXMSG_ACCESS_KEY", APP[0])
    monkeypatch.setenv("TXMSG_SECRET_KEY", "not-the-secret")
    topic, group = unique("acl_topic"), unique("acl_pg")
    create_topic(acl_broker.namesrv_addr, topic, message_type="TRANSACTION", credentials=ADMIN)
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Pay:
        def execute_local(self, message: Message, arg: Any) -> S:
            raise AssertionError("must not run: the half message was refused")

        def check_local(self, message: Message) -> S:
            return S.ROLLBACK

    with (
        _app(acl_broker, tmp_path, registry) as app,
        pytest.raises(SendError, match="access_key/secret_key"),
    ):
        app.producer(group).send_in_transaction(topic, b"refused")
    log = read_log(acl_broker.log_dir, "broker.log")
    assert f"Check signature failed for accessKey={APP[0]}" in log


def test_doctor_never_prints_the_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TXMSG_ACCESS_KEY", APP[0])
    monkeypatch.setenv("TXMSG_SECRET_KEY", APP[1])
    monkeypatch.setenv("TXMSG_NAME_SERVER", "127.0.0.1:1")
    result = CliRunner().invoke(main, ["doctor"])
    assert "secret_key" in result.output
    assert APP[1] not in result.output
    assert APP[0] not in result.output  # the access key is masked as well


def test_demo_against_an_acl_broker_is_consistent(acl_broker: Any, tmp_path: Path) -> None:
    """``txmsg demo --name-server`` with the keys in the environment: it creates its topic with them
    (an admin account is needed for that) and ends CONSISTENT."""
    env = {**os.environ, "TXMSG_ACCESS_KEY": ADMIN[0], "TXMSG_SECRET_KEY": ADMIN[1]}
    env.pop("TXMSG_CONFIG", None)
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("txmsg")),
            "demo",
            "--name-server",
            acl_broker.namesrv_addr,
            "--orders",
            "16",
            "--threads",
            "4",
            "--seed",
            "5",
            "--timeout",
            "90",
            "--workdir",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,  # samples/ runs from the checkout
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "CONSISTENT" in out
    assert "created/updated on broker-a" in out
