"""The subscription group table: ``UPDATE_AND_CREATE_SUBSCRIPTIONGROUP`` (200), as ``mqadmin updateSubGroup``
sends it, kept in ``<data_dir>/config/subscriptionGroup.json``.

Why the embedded broker needs it: a RocketMQ 5 proxy consumes a group in order (FIFO pop, Settings
``subscription.fifo``) exactly when the group's ``SubscriptionGroupConfig.consumeMessageOrderly`` is
true (``GrpcClientSettingsManager.mergeSubscriptionData`` -> ``ReceiveMessageActivity`` reads the merged
``fifo``); the topic's ``message.type`` plays no part on the consuming side.  A group nobody created is
auto-created non-orderly (``autoCreateSubscriptionGroup``), so an orderly listener whose group was not
created with ``-o true`` gets concurrent pops on a real cluster: the embedded broker answers the same,
and tests catch the missing step instead of passing here and losing order in production.

Only the fields the embedded broker acts on are interpreted (``consumeMessageOrderly``); the whole
config the client sent is kept, so a later read shows what the operator set.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import fastjson
from .codec import SYSTEM_ERROR, RemotingCommand
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker

UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200


def group_config_body(name: str, *, orderly: bool = False, retry_max_times: int = 16) -> bytes:
    """The ``SubscriptionGroupConfig`` body ``mqadmin updateSubGroup -g NAME [-o true]`` sends."""
    return fastjson.dumps(
        {
            "groupName": name,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True,
            "consumeMessageOrderly": orderly,
            "retryQueueNums": 1,
            "retryMaxTimes": retry_max_times,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True,
        }
    )


class SubscriptionGroups:
    """Thread-safe group table (the gRPC endpoint reads it on its loop, admin requests write it)."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / "config" / "subscriptionGroup.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text())
                self._groups = {
                    str(k): dict(v) for k, v in raw.get("subscriptionGroupTable", {}).items()
                }
            except (ValueError, AttributeError, TypeError):
                os.replace(
                    self.path, self.path.with_suffix(".corrupt")
                )  # keep it for a look, start empty

    def get(self, group: str) -> dict[str, Any] | None:
        with self._lock:
            config = self._groups.get(group)
            return dict(config) if config is not None else None

    def orderly(self, group: str) -> bool:
        """``consumeMessageOrderly`` of ``group`` (False for a group nobody created)."""
        config = self.get(group)
        return bool(config and config.get("consumeMessageOrderly"))

    def put(self, config: dict[str, Any]) -> None:
        name = str(config["groupName"])
        with self._lock:
            self._groups[name] = dict(config)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(
                json.dumps({"subscriptionGroupTable": self._groups}, indent=1, sort_keys=True)
            )
            os.replace(tmp, self.path)


_TABLES: weakref.WeakKeyDictionary[Broker, SubscriptionGroups] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def of(broker: Broker) -> SubscriptionGroups:
    """The group table of ``broker`` (one per broker, opened on first use)."""
    with _TABLES_LOCK:
        table = _TABLES.get(broker)
        if table is None:
            table = _TABLES[broker] = SubscriptionGroups(broker.config.data_dir)
        return table


def install(broker: Broker) -> None:
    """Register the admin request (``AdminBrokerProcessor.updateAndCreateSubscriptionGroup``)."""
    table = of(broker)

    async def update_and_create(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            config = fastjson.loads(cmd.body) if cmd.body else None
        except ValueError as exc:
            return cmd.error(SYSTEM_ERROR, f"the subscription group config is not JSON: {exc}")
        if not isinstance(config, dict) or not str(config.get("groupName") or "").strip():
            return cmd.error(SYSTEM_ERROR, "the subscription group config has no groupName")
        table.put(config)
        broker.logs.broker.info(
            "AdminBrokerThread_1",
            f"updateAndCreateSubscriptionGroup called by {conn.remote_addr}, {config.get('groupName')} "
            f"consumeMessageOrderly={bool(config.get('consumeMessageOrderly'))}",
        )
        return cmd.response()

    broker.register(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, update_and_create, inline=True)
