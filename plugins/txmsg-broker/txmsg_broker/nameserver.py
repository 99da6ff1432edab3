"""A stand-alone name server (``python -m txmsg_broker namesrv``) for clusters of several brokers.

Why a process of its own: with several brokers, killing one (``kill -9`` in the tests and the chaos
run) must leave the routes of the others served, exactly as on a real cluster where ``mqnamesrv``
and the brokers are separate processes and the name server drops a broker whose connection closed.
A single broker (``txmsg broker`` without ``--brokers``) keeps its in-process name server
(``namesrv.py``), which reads the broker's topic table directly.

Serves GET_ROUTEINFO_BY_TOPIC (105) and GET_BROKER_CLUSTER_INFO (106) from a
:class:`~txmsg_broker.route_table.RouteTable` filled by REGISTER_BROKER (103) / UNREGISTER_BROKER
(104); logs to ``namesrv.log`` in the real line format with 4.9.8's message texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from . import fastjson
from .codec import (
    GET_BROKER_CLUSTER_INFO,
    GET_ROUTEINFO_BY_TOPIC,
    SYSTEM_ERROR,
    TOPIC_NOT_EXIST,
    RemotingCommand,
)
from .namesrv import topic_not_exist_remark
from .route_table import BROKER_EXPIRED_MS, RouteTable, topics_from_wrapper
from .transport import Connection, RemotingServer
from .txlog import RocketLog

REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
#: 4.9.8 ``NamesrvController``: ``scanNotActiveBroker`` every 10 s
SCAN_INTERVAL_S = 10.0
THREAD = "RemotingExecutorThread_1"


class NameServer:
    """Route table + remoting server on one event loop; ``await start()`` / ``await stop()``."""

    def __init__(
        self,
        host: str,
        port: int,
        log_dir: str | Path,
        *,
        expired_ms: int = BROKER_EXPIRED_MS,
        restartable: bool = False,
    ) -> None:
        self.host = host
        self.routes = RouteTable(expired_ms=expired_ms)
        self.server = RemotingServer(
            "namesrv", host, port, listener="name server", restartable=restartable
        )
        self.log = RocketLog(Path(log_dir) / "namesrv.log")
        self.server.on_error = lambda text: self.log.error("NettyServerCodecThread_1", text)
        self.server.on_connection_closed.append(self._channel_closed)
        self.server.register(REGISTER_BROKER, self._register, inline=True)
        self.server.register(UNREGISTER_BROKER, self._unregister, inline=True)
        self.server.register(GET_ROUTEINFO_BY_TOPIC, self._route, inline=True)
        self.server.register(GET_BROKER_CLUSTER_INFO, self._cluster_info, inline=True)
        self._scan: asyncio.Task[None] | None = None

    @property
    def addr(self) -> str:
        ip = "127.0.0.1" if self.host in ("0.0.0.0", "", "localhost") else self.host  # noqa: S104 - a comparison, not a bind
        return f"{ip}:{self.server.port}"

    async def start(self) -> None:
        await self.server.start()
        self._scan = asyncio.get_running_loop().create_task(self._scan_loop())
        self.log.info(
            "main", f"The Name Server boot success. serializeType=JSON, address {self.addr}"
        )

    async def stop(self) -> None:
        if self._scan is not None:
            self._scan.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan
        await self.server.stop()
        self.log.info("main", "Shutdown hook over.")
        self.log.close()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(SCAN_INTERVAL_S)
            for entry in self.routes.expire():
                self.log.warn(
                    "NSScheduledThread1",
                    f"The broker channel expired, {entry.broker_addr} {self.routes.expired_ms}ms",
                )

    # -- handlers -------------------------------------------------------------------------------
    async def _register(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        name, addr = cmd.ext("brokerName"), cmd.ext("brokerAddr")
        cluster = cmd.ext("clusterName", "DefaultCluster")
        if not name or not addr:
            return cmd.error(SYSTEM_ERROR, "REGISTER_BROKER needs brokerName and brokerAddr")
        if cmd.ext_int("brokerId", 0) != 0:
            return cmd.error(SYSTEM_ERROR, "this name server routes masters only (brokerId 0)")
        try:
            body = json.loads(cmd.body or b"{}")
            topics = topics_from_wrapper(name, body.get("topicConfigSerializeWrapper") or {})
        except (ValueError, TypeError, AttributeError) as exc:
            return cmd.error(SYSTEM_ERROR, f"unreadable registration body: {exc}")
        if self.routes.register(cluster, name, addr, topics, conn):
            self.log.info(
                THREAD, f"new broker registered, {addr} HAServer: {cmd.ext('haServerAddr')}"
            )
        return cmd.response(ext_fields={"haServerAddr": "", "masterAddr": ""}, body=b'{"table":{}}')

    async def _unregister(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        name, addr = cmd.ext("brokerName"), cmd.ext("brokerAddr")
        removed = self.routes.unregister(name, addr)
        self.log.info(
            THREAD,
            f"unregisterBroker, remove addr from brokerAddrTable {'OK' if removed else 'Failed'}, {addr}",
        )
        return cmd.response()

    async def _route(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext("topic")
        body = self.routes.route_body(topic)
        if body is None:
            return cmd.error(TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
        return cmd.response(body=body)

    async def _cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(body=fastjson.dumps(self.routes.cluster_info()))

    def _channel_closed(self, conn: Connection) -> None:
        for entry in self.routes.remove_channel(conn):
            self.log.info(
                "NettyEventExecutor",
                f"the broker's channel destroyed, {conn.remote_addr}, clean it's data structure at once",
            )
            self.log.info(
                "NettyEventExecutor",
                f"remove brokerAddr[0, {entry.broker_addr}, {entry.broker_name}] from brokerAddrTable, "
                "because channel destroyed",
            )
