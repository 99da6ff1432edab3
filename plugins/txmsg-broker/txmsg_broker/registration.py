"""A broker's registration with external name servers (REGISTER_BROKER 103 / UNREGISTER_BROKER 104).

Used when the broker runs with ``namesrv_addr`` (``txmsg broker --brokers N``: one name server
process, N broker processes).  Like 4.9.8's ``BrokerController.registerBrokerAll``, the broker sends
its whole topic table

* at start (awaited, so a broker that says it is ready is in the routes),
* every ``register_interval_ms`` (``registerNameServerPeriod``, 30 s: also the name server's proof of
  life - it forgets a broker silent for 120 s),
* right after it created or changed a topic: awaited by UPDATE_AND_CREATE_TOPIC (``mqadmin
  updateTopic``/``txmsg topic create`` return once the route exists, as Java's
  ``registerIncrementBrokerData`` does), written without waiting for the answer after a send or a
  heartbeat created one (Java's ``registerBrokerAll(false, true, true)`` is oneway there too);
* and UNREGISTER_BROKER on a clean stop.  A ``kill -9`` sends nothing: the name server drops the
  broker when the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import struct
import threading
import zlib
from typing import TYPE_CHECKING, Any

from .codec import SUCCESS, RemotingCommand
from .topics import DEFAULT_TOPIC

if TYPE_CHECKING:
    from .broker import Broker

REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
THREAD = "brokerOutApi_thread_1"
#: 4.9.8 ``registerBrokerTimeoutMills``
TIMEOUT_S = 6.0


class NamesrvLink:
    """One persistent connection to one name server; requests matched to answers by opaque."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaque = itertools.count(1)
        self._connecting: asyncio.Lock | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.connected:
                return
            host, _, port = self.addr.rpartition(":")
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port)), TIMEOUT_S
            )
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                cmd = RemotingCommand.decode(await reader.readexactly(length))
                future = self._pending.pop(cmd.opaque, None)
                if future is not None and not future.done():
                    future.set_result(cmd)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._drop(ConnectionError(f"connection to the name server {self.addr} closed"))

    def _drop(self, exc: BaseException) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)

    def write(
        self, code: int, ext: dict[str, Any], body: bytes
    ) -> asyncio.Future[RemotingCommand] | None:
        """Write one request now (on the loop thread); the future of its answer, None if not connected."""
        if not self.connected or self._writer is None:
            return None
        opaque = next(self._opaque)
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        request = RemotingCommand.request(code, ext, body, opaque=opaque)
        self._writer.write(request.encode())
        return future

    async def call(self, code: int, ext: dict[str, Any], body: bytes) -> RemotingCommand:
        await self.connect()
        future = self.write(code, ext, body)
        if future is None:
            raise ConnectionError(f"not connected to the name server {self.addr}")
        return await asyncio.wait_for(future, TIMEOUT_S)

    async def close(self) -> None:
        task, self._reader_task = self._reader_task, None
        self._drop(ConnectionError("closed"))
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Registrar:
    """Keeps the broker registered with every name server of ``config.namesrv_addr``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        addrs = [a.strip() for a in (broker.config.namesrv_addr or "").split(";") if a.strip()]
        self.links = [NamesrvLink(a) for a in addrs]
        self._task: asyncio.Task[None] | None = None
        self._loop_thread: int | None = None
        broker.topics.add_listener(lambda _cfg: self.trigger())

    # -- what is sent ---------------------------------------------------------------------------
    def _header(self, body: bytes | None = None) -> dict[str, Any]:
        b = self.broker
        ext: dict[str, Any] = {
            "brokerName": b.broker_name,
            "brokerAddr": b.broker_addr,
            "clusterName": b.config.cluster_name,
            "brokerId": 0,
        }
        if body is not None:
            ext.update(haServerAddr="", compressed="false", bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF)
        return ext

    def body(self) -> bytes:
        """4.9.8 ``RegisterBrokerBody``: the topic table (TBW102 only with auto-create, as Java)."""
        table = {}
        for cfg in self.broker.topics.all():
            if cfg.topic_name == DEFAULT_TOPIC and not self.broker.config.auto_create_topics:
                continue
            table[cfg.topic_name] = {
                "topicName": cfg.topic_name,
                "readQueueNums": cfg.read_queue_nums,
                "writeQueueNums": cfg.write_queue_nums,
                "perm": cfg.perm,
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": cfg.topic_sys_flag,
                "order": cfg.order,
                "attributes": cfg.attributes,
            }
        wrapper = {
            "topicConfigTable": table,
            "dataVersion": {"timestamp": 0, "counter": len(table)},
        }
        return json.dumps(
            {"topicConfigSerializeWrapper": wrapper, "filterServerList": []}, separators=(",", ":")
        ).encode()

    # -- when -----------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop_thread = threading.get_ident()
        await self.register_now()
        self._task = self.broker.spawn(self._periodic())

    async def _periodic(self) -> None:
        interval = self.broker.config.register_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self.register_now()

    async def register_now(self) -> bool:
        """Register with every name server and wait for the answers; True if all accepted."""
        body = self.body()
        results = await asyncio.gather(
            *(link.call(REGISTER_BROKER, self._header(body), body) for link in self.links),
            return_exceptions=True,
        )
        ok = True
        for link, result in zip(self.links, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                self.broker.logs.broker.warn(
                    THREAD, f"registerBroker Exception, {link.addr}: {result!r}"
                )
            elif result.code != SUCCESS:
                ok = False
                self.broker.logs.broker.warn(
                    THREAD,
                    f"registerBroker to {link.addr} refused (code {result.code}): {result.remark}",
                )
        return ok

    def trigger(self) -> None:
        """A topic changed: register now without waiting (callable from any thread)."""
        loop = self.broker.loop
        if loop is None or loop.is_closed():
            return  # not started yet: start() registers everything
        if threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self.trigger)
            return
        body = self.body()
        for link in self.links:
            future = link.write(REGISTER_BROKER, self._header(body), body)
            if future is not None:
                future.add_done_callback(_ignore_outcome)
            else:  # reconnect in the background; the periodic registration retries anyway
                self.broker.spawn(self._register_one(link, body))

    async def _register_one(self, link: NamesrvLink, body: bytes) -> None:
        with contextlib.suppress(OSError, TimeoutError, ConnectionError):
            await link.call(REGISTER_BROKER, self._header(body), body)

    async def stop(self) -> None:
        """UNREGISTER_BROKER (clean shutdown only), then close the connections."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for link in self.links:
            if link.connected:
                with contextlib.suppress(OSError, TimeoutError, ConnectionError):
                    await asyncio.wait_for(link.call(UNREGISTER_BROKER, self._header(), b""), 2.0)
            await link.close()


def _ignore_outcome(future: asyncio.Future[RemotingCommand]) -> None:
    if not future.cancelled():
        future.exception()  # mark retrieved: a lost oneway registration is retried periodically
