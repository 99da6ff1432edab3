"""The embedded broker: one object owning the store, topics, clients, logs and both TCP servers.

Extension API (used by ``consumer_service.py`` and its parts; stable):

* ``broker.register(code, handler, *, inline=False)`` - handle a request code on the broker port.
  ``handler(cmd: RemotingCommand, conn: Connection) -> Awaitable[RemotingCommand | None]``; return
  ``cmd.response(...)`` (opaque/flag are fixed up for you) or None for oneway requests. Handlers not
  marked ``inline`` run as their own task, so they may wait (long polling). Raising ``ValueError`` gives
  the client a SYSTEM_ERROR with the message as remark; the connection stays open.
* ``broker.store`` (:class:`~txmsg_broker.store.MessageStore`): ``put``/``get``/``get_raw``/offsets;
  ``broker.store.on_put(cb)`` fires after every put (wake long polls there).
* ``broker.put_message(msg)`` - store a client message through the put filters (use it for anything
  that should behave like a client send); ``broker.add_put_filter(fn)`` adds ``fn(msg) -> msg`` that
  may rewrite a message before it is stored (e.g. DELAY → ``SCHEDULE_TOPIC_XXXX``).
* ``broker.clients`` (:class:`~txmsg_broker.clients.ClientRegistry`): producer/consumer groups,
  ``consumer_client_ids(group)``, ``consumer_connections(group)``, ``add_listener(fn(event, group, conn))``.
* ``conn.send_oneway(code, ext_fields, body)`` - a broker → client oneway request.
* ``broker.topics`` (:class:`~txmsg_broker.topics.TopicManager`), ``broker.config`` (:class:`BrokerConfig`),
  ``broker.logs.broker`` / ``broker.logs.transaction`` (real-format log files).
* ``broker.spawn(coro)`` - a background task cancelled on stop; ``broker.on_stop(fn)`` - sync cleanup.
* ``broker.on_start(fn)`` - ``fn()`` on the loop once the broker serves; ``broker.on_stopping(fn)`` -
  ``await fn()`` first thing in ``stop()``, while connections are still open (e.g. answer held pulls).
* ``broker.loop`` - the event loop the broker runs on (set by ``start``).

At construction the broker imports ``txmsg_broker.consumer_service`` if present and calls its
``install(broker)``, which sets ``broker.consumers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from . import (
    acl,
    admin_service,
    broker_config_service,
    client_service,
    diskfull,
    namesrv,
    send_service,
    time_control,
    transaction_service,
)
from .clients import ClientRegistry
from .clock import Clock, ManualClock, RealClock
from .config import BrokerConfig
from .message_codec import StoredMessage
from .registration import Registrar
from .store import MessageStore
from .topics import TopicManager
from .transport import Connection, Handler, RemotingServer
from .txlog import BrokerLogs

if TYPE_CHECKING:
    from .consumer_service import ConsumerService
    from .grpc.server import GrpcEndpoint

log = logging.getLogger("txmsg_broker.broker")

PutFilter = Callable[[StoredMessage], StoredMessage]


class Broker:
    """Name server + broker in one object; ``await start()`` / ``await stop()`` on one event loop."""

    #: the consumer side, set by ``consumer_service.install`` during construction
    consumers: ConsumerService

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        config.log_dir.mkdir(parents=True, exist_ok=True)
        self.broker_name = config.broker_name
        self.logs = BrokerLogs(config.log_dir, config.transaction_log_level)
        try:
            self._construct(config)
        except BaseException:
            self.release()  # a broker that cannot be built leaves no open log or store file behind
            raise

    def _construct(self, config: BrokerConfig) -> None:
        """Everything after the logs are open (the constructor closes them if this raises)."""
        #: the one clock of the time-driven services (:mod:`.clock`); manual only in tests
        self.clock: Clock = ManualClock() if config.manual_clock else RealClock()
        self.store = MessageStore(
            config.data_dir, config.flush, store_host=self.broker_addr, clock=self.clock
        )
        self.topics = TopicManager(config.data_dir, default_queue_nums=config.default_queue_nums)
        self.clients = ClientRegistry()
        restartable = config.restartable_ports
        self.server = RemotingServer(
            "broker", config.host, config.broker_port, restartable=restartable
        )
        #: the in-process name server; None with external ones (``config.namesrv_addr``, several brokers)
        self.namesrv_server: RemotingServer | None = None
        if config.namesrv_addr is None:
            self.namesrv_server = RemotingServer(
                "namesrv",
                config.host,
                config.namesrv_port,
                listener="name server",
                restartable=restartable,
            )
        self.server.on_error = lambda text: self.logs.broker.error("NettyServerCodecThread_1", text)
        if self.namesrv_server is not None:
            self.namesrv_server.on_error = self.server.on_error
        self.server.on_connection_closed.append(self._connection_closed)
        self.put_filters: list[PutFilter] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._start_callbacks: list[Callable[[], None]] = []
        self._stopping_callbacks: list[Callable[[], Awaitable[None]]] = []
        self._stop_callbacks: list[Callable[[], None]] = []
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._sync_running = False
        #: the running group commit (a reference, so the loop cannot drop the task)
        self._sync_task: asyncio.Task[None] | None = None

        #: registration with external name servers (``registration.py``); None with the in-process one
        self.registrar: Registrar | None = None
        if self.namesrv_server is not None:
            namesrv.install(self)
        else:
            self.registrar = Registrar(self)
        client_service.install(self)
        admin_service.install(self)
        broker_config_service.install(self)
        send_service.install(self)
        self.transactions = transaction_service.install(self)
        diskfull.install(self)
        self._install_extensions()
        if config.acl is not None:  # last: it guards every code registered above
            acl.install(self)
        if isinstance(self.clock, ManualClock):  # a test's broker: not guarded by ACL
            time_control.install(self, self.clock)
        #: the RocketMQ 5 gRPC endpoint (``txmsg_broker.grpc``), when ``config.grpc_port`` is set
        self.grpc: GrpcEndpoint | None = None
        if config.grpc_port is not None:
            from .grpc.server import GrpcEndpoint  # noqa: PLC0415 - optional dependency (grpcio)

            self.grpc = GrpcEndpoint(self)

    def release(self) -> None:
        """Close the store and the log files of a broker whose start failed (or was never
        attempted); :meth:`stop` does this and more for a started one."""
        store = self.__dict__.get("store")
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        with contextlib.suppress(Exception):
            self.logs.close()

    # -- properties -----------------------------------------------------------------------------
    @property
    def broker_addr(self) -> str:
        return f"{self.config.advertised_ip}:{self.config.broker_port}"

    @property
    def namesrv_addr(self) -> str:
        if self.config.namesrv_addr is not None:
            return self.config.namesrv_addr
        return f"{self.config.bind_ip}:{self.config.namesrv_port}"

    async def publish_routes(self) -> None:
        """Wait until the name servers route the current topic table (external ones: re-register;
        the in-process one reads the table directly)."""
        if self.registrar is not None:
            await self.registrar.register_now()

    # -- extension API --------------------------------------------------------------------------
    def register(self, code: int, handler: Handler, *, inline: bool = False) -> None:
        self.server.register(code, handler, inline=inline)

    def add_put_filter(self, fn: PutFilter) -> None:
        self.put_filters.append(fn)

    def put_message(self, msg: StoredMessage, *, defer_sync: bool = False) -> StoredMessage:
        for fn in self.put_filters:
            msg = fn(msg)
        return self.store.put(msg, defer_sync=defer_sync)

    def put_messages(
        self, msgs: list[StoredMessage], *, defer_sync: bool = False
    ) -> list[StoredMessage]:
        for fn in self.put_filters:
            msgs = [fn(m) for m in msgs]
        return self.store.put_many(msgs, defer_sync=defer_sync)

    async def durable(self) -> None:
        """Wait until everything written so far is on disk (sync mode; no-op in async mode).

        Group commit: concurrent waiters share one ``fdatasync`` run in a worker thread, so several
        clients cost one disk flush instead of one each.
        """
        if self.config.flush != "sync":
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._sync_waiters.append(fut)
        if not self._sync_running:
            self._sync_running = True
            self._sync_task = loop.create_task(self._group_commit())
        await fut

    def request_sync(self) -> None:
        """Schedule a group commit without waiting for it (for writes nobody acknowledges)."""
        if self.config.flush == "sync" and self.loop is not None and not self._sync_running:
            self._sync_running = True
            self._sync_task = self.loop.create_task(self._group_commit())

    async def _group_commit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = True
            while first or self._sync_waiters:
                first = False
                batch, self._sync_waiters = self._sync_waiters, []
                try:
                    await loop.run_in_executor(None, self.store.sync)
                except Exception as exc:  # noqa: BLE001 - every waiter gets the failure, whatever it is
                    for fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for fut in batch:
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._sync_running = False

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        loop = self.loop or asyncio.get_running_loop()
        task = loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.logs.broker.error(
                "BrokerControllerScheduledThread1", f"background task failed: {exc!r}"
            )

    def on_start(self, fn: Callable[[], None]) -> None:
        self._start_callbacks.append(fn)

    def on_stopping(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._stopping_callbacks.append(fn)

    def on_stop(self, fn: Callable[[], None]) -> None:
        self._stop_callbacks.append(fn)

    def _install_extensions(self) -> None:
        try:
            module = importlib.import_module("txmsg_broker.consumer_service")
        except ModuleNotFoundError as exc:
            if exc.name != "txmsg_broker.consumer_service":
                raise
            return
        install = getattr(module, "install", None)
        if install is not None:
            install(self)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.namesrv_server is not None:
            await self.namesrv_server.start()
            self.config.namesrv_port = self.namesrv_server.port
        await self.server.start()
        self.config.broker_port = self.server.port
        self.store.store_host = self.broker_addr
        if self.grpc is not None:
            await self.grpc.start()
        self._log_startup()
        if self.registrar is not None:
            await self.registrar.start()
        self.spawn(self._flush_loop())
        self.transactions.start()
        for fn in self._start_callbacks:
            fn()

    def _log_startup(self) -> None:
        b = self.logs.broker
        c = self.config
        for key, value in (
            ("namesrvAddr", self.namesrv_addr),
            ("brokerIP1", c.advertised_ip),
            ("brokerName", c.broker_name),
            ("brokerClusterName", c.cluster_name),
            ("brokerId", 0),
            ("autoCreateTopicEnable", str(c.auto_create_topics).lower()),
            ("transactionTimeOut", c.transaction_timeout_ms),
            ("transactionCheckMax", c.check_max),
            ("transactionCheckInterval", c.check_interval_ms),
            ("fileReservedTime", c.file_reserved_time),
            *(
                [
                    ("transactionOpBatchInterval", c.op_batch_interval_ms),
                    ("transactionOpMsgMaxSize", c.transaction_op_msg_max_size),
                ]
                if c.broker_version == "5.3.3"
                else []
            ),
            ("listenPort", c.broker_port),
            ("flushDiskType", "SYNC_FLUSH" if c.flush == "sync" else "ASYNC_FLUSH"),
            ("maxMessageSize", c.max_message_size),
            ("storePathRootDir", c.data_dir),
        ):
            b.info("main", f"{key}={value}")
        b.info(
            "main",
            f"The broker[{c.broker_name}, {self.broker_addr}] boot success. serializeType=JSON "
            f"and name server is {self.namesrv_addr}",
        )

    async def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            try:
                await loop.run_in_executor(None, self.store.flush)
            except Exception as exc:  # noqa: BLE001 - the flush loop must keep running
                self.logs.broker.error("FlushRealTimeService", f"flush failed: {exc!r}")

    async def stop(self) -> None:
        """Stop serving, cancel background work, flush and close everything."""
        for stopping in self._stopping_callbacks:
            await stopping()
        if self.registrar is not None:
            await self.registrar.stop()
        if self.grpc is not None:
            await self.grpc.stop()
        await self.transactions.stop()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.server.stop()
        if self.namesrv_server is not None:
            await self.namesrv_server.stop()
        for fn in self._stop_callbacks:
            try:
                fn()
            except Exception:
                log.exception("stop callback failed")
        self.store.close()
        self.logs.broker.info("main", "Shutdown hook over.")
        self.logs.close()

    # -- connection bookkeeping -----------------------------------------------------------------
    def _connection_closed(self, conn: Connection) -> None:
        for kind, group, channel in self.clients.remove_connection(conn):
            self.logs.broker.info(
                "NettyEventExecutor",
                f"NETTY EVENT: remove channel[{channel.describe()}][{conn.remote_addr}] from {kind}Table"
                if kind == "producer"
                else f"NETTY EVENT: remove channel[{channel.describe()}][{conn.remote_addr}] from ConsumerManager consumerTable",
            )
            if kind == "consumer":
                info = self.clients.consumer_group(group)
                if info is not None and not info.channels:
                    self.logs.broker.info(
                        "NettyEventExecutor",
                        f"unregister consumer ok, no any connection, and remove consumer group, {group}",
                    )
