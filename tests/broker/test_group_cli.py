"""``txmsg group create NAME [--orderly]``: the SubscriptionGroupConfig ``mqadmin updateSubGroup`` sends,
stored by every master (the embedded broker's gRPC endpoint pops a group in order only when it is set)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from txmsg_broker.cli import group as group_cli
from txmsg_broker.testing import unique


def stored_groups(data_dir: Path) -> dict[str, dict[str, object]]:
    table = json.loads((Path(data_dir) / "config" / "subscriptionGroup.json").read_text())
    return dict(table["subscriptionGroupTable"])


def test_create_then_update_an_orderly_group(txmsg_broker):
    name = unique("OrderlyCG")
    result = CliRunner().invoke(
        group_cli, ["create", name, "--orderly", "--namesrv", txmsg_broker.namesrv_addr]
    )
    assert result.exit_code == 0, result.output
    assert "create subscription group to" in result.output
    assert stored_groups(txmsg_broker.data_dir)[name]["consumeMessageOrderly"] is True

    result = CliRunner().invoke(
        group_cli,
        [
            "create",
            name,
            "--no-orderly",
            "--retry-max-times",
            "3",
            "--namesrv",
            txmsg_broker.namesrv_addr,
        ],
    )
    assert result.exit_code == 0, result.output
    stored = stored_groups(txmsg_broker.data_dir)[name]
    assert stored["consumeMessageOrderly"] is False
    assert stored["retryMaxTimes"] == 3


def test_an_unreachable_name_server_is_a_clear_error():
    result = CliRunner().invoke(group_cli, ["create", "SomeCG", "--namesrv", "127.0.0.1:1"])
    assert result.exit_code != 0
    assert "cannot reach the name server at 127.0.0.1:1" in result.output
