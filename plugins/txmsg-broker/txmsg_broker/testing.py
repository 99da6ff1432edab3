"""Helpers for tests that drive the embedded broker with the *real* client (rocketmq-client-python).

They encode the wrapper hazards from ``docs/rocketmq-facts.md``:

* every client gets a unique instance name (C API ``SetProducerInstanceName`` / consumer
  ``set_instance_name``) so clients of different tests never share one librocketmq client factory, and
  several producers of one group get separate connections (needed for round-robin check-backs);
* callbacks never let an exception escape (the wrapper would leave the return value unwritten) and are
  counted, so ``close()`` waits until none is running (shutting down during a check callback segfaults);
* ``msg.keys`` comes back as bytes - ``Received.keys`` is always ``str``;
* a producer shut down while librocketmq's route-refresh timer runs (3 s after start, then every 30 s)
  can abort the process (seen here: "Fatal Python error: Aborted" inside ``shutdown``); ``close()``
  therefore never shuts a producer down within a short window around those instants.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable
from ctypes import c_int, c_void_p
from dataclasses import dataclass, field
from typing import Any, TypeVar

from txmsg_rocketmq.names import consumer_names_hazard

from . import cli

T = TypeVar("T")

_counter = itertools.count(1)
#: multiplies every ``wait_until`` timeout (:func:`set_timeout_scale`)
_timeout_scale = 1.0


def set_timeout_scale(scale: float) -> None:
    """Make every ``wait_until`` wait ``scale`` times longer: the pytest plugin sets it for a run
    against a real cluster, whose retry and check delays are real seconds (the embedded broker's
    test fixtures scale them down)."""
    global _timeout_scale  # one setting for the whole test session
    if scale <= 0:
        raise ValueError(f"timeout scale must be > 0, got {scale}")
    _timeout_scale = scale


def unique(prefix: str) -> str:
    """A name unique to this test run (topics, groups, instance names)."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.02,
    message: str | Callable[[], str] = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that value.

    The one polling helper of the tests, samples and benchmarks: a test waits for an observable
    condition (a row, a delivery, a log line, a counter) instead of sleeping and hoping.  On timeout
    it raises ``AssertionError`` naming what was awaited (``message``; pass a callable to describe
    the state at the moment of failure) and the predicate's last value, so a failing wait reads
    like a failing assert.  ``timeout`` is required and generous by intent: it bounds a wait, it is
    not a timing assertion.  The predicate always runs at least once, and once more at the
    deadline, so a slow last poll is not lost.  Use it as a statement (not ``assert wait_until``:
    ``python -O`` would drop the wait together with the assert).
    """
    timeout *= _timeout_scale
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    what = message() if callable(message) else message
    raise AssertionError(
        f"timed out after {timeout:g} s waiting for {what or 'the condition'}; last value: {last!r}"
    )


class AllAtOnce:
    """Proves that ``n`` callers run at the same time by an event, not a timing.

    Why shared: the check-back concurrency tests of every backend (``tests/contract``,
    ``tests/rocketmq5``) make ``n`` checks meet at a barrier inside ``check_local``; it trips only
    if they all run at once.  :meth:`arrive` returns True once all ``n`` are inside together (the
    key joins :attr:`passed`), or False if the barrier times out (it joins :attr:`broken`); a key
    that passed already returns True at once (a re-check after the answer proves nothing more).
    """

    def __init__(self, n: int, timeout: float = 15.0) -> None:
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.lock = threading.Lock()
        self.passed: list[str] = []
        self.broken: list[str] = []

    def arrive(self, key: str) -> bool:
        with self.lock:
            if key in self.passed:
                return True
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            with self.lock:
                self.broken.append(key)
            return False
        with self.lock:
            self.passed.append(key)
        return True

    def arrived(self) -> int:
        """How many keys have passed or broken so far."""
        with self.lock:
            return len(self.passed) + len(self.broken)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


@dataclass
class Received:
    topic: str
    body: bytes
    keys: str
    tags: str
    msg_id: str
    reconsume_times: int
    properties: dict[str, str] = field(default_factory=dict)
    thread: str = ""


class InFlight:
    """Counts running callbacks so shutdown can wait for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.total = 0

    def __enter__(self) -> InFlight:
        with self._lock:
            self.count += 1
            self.total += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1

    def wait_idle(self, timeout: float = 15.0) -> bool:
        """True once no callback runs; False on timeout (``close()`` then goes ahead anyway)."""
        try:
            wait_until(lambda: self.count == 0, timeout=timeout, message="running callbacks to end")
        except AssertionError:
            return False
        return True


def set_producer_instance_name(producer: Any, name: str) -> None:
    """The Python wrapper has no method for it; call the C API on the producer's handle."""
    from rocketmq.ffi import dll  # noqa: PLC0415 - loads librocketmq (native)

    status = dll.SetProducerInstanceName(producer._handle, name.encode())
    if status != 0:
        raise RuntimeError(f"SetProducerInstanceName failed with status {status}")


def enable_consumer_trace(consumer: Any, on: bool = True) -> None:
    """Message trace ON before ``start()``: librocketmq 2.1.0 segfaults in ``PushConsumer.shutdown()`` when
    the consumer was started with trace off (apache/rocketmq-client-cpp#286). Switching it OFF again after
    ``start()`` keeps shutdown safe and stops trace messages (found by helper R). The wrapper does not
    declare this C function, so declare it (an undeclared 64-bit handle is truncated and crashes too)."""
    from rocketmq.ffi import dll  # noqa: PLC0415 - loads librocketmq (native)

    dll.SetPushConsumerMessageTrace.argtypes = [c_void_p, c_int]
    dll.SetPushConsumerMessageTrace.restype = c_int
    status = dll.SetPushConsumerMessageTrace(
        consumer._handle, 0 if on else 1
    )  # 0 = OPEN, 1 = CLOSE
    if status != 0:
        raise RuntimeError(f"SetPushConsumerMessageTrace failed with status {status}")


#: group of the helper producer :meth:`Clients.heartbeat` starts (it shows up in broker.log)
HEARTBEAT_GROUP = "TXMSG_TEST_HEARTBEAT"


class Clients:
    """Creates real clients against one name server and shuts them all down safely."""

    def __init__(self, namesrv_addr: str, *, credentials: tuple[str, str] | None = None) -> None:
        self.namesrv_addr = namesrv_addr
        #: (access key, secret key) every client signs with (a broker with ACL); None = unsigned
        self.credentials = credentials
        self.producers: list[Any] = []
        self.consumers: list[Any] = []
        self.in_flight = InFlight()
        self.started_at: dict[int, float] = {}
        self.instance_names: dict[int, str] = {}

    # -- producers ------------------------------------------------------------------------------
    def producer(
        self, group: str | None = None, *, instance: str | None = None, **kwargs: Any
    ) -> Any:
        from rocketmq.client import Producer  # noqa: PLC0415 - loads librocketmq (native)

        p = Producer(group or unique("PG"), **kwargs)
        self.instance_names[id(p)] = instance = instance or unique("inst")
        set_producer_instance_name(p, instance)
        p.set_name_server_address(self.namesrv_addr)
        self._sign(p)
        p.start()
        self.started_at[id(p)] = time.monotonic()
        self.producers.append(p)
        return p

    def transaction_producer(
        self,
        group: str,
        checker: Callable[[Any], Any],
        *,
        instance: str | None = None,
    ) -> Any:
        """A TransactionMQProducer whose checker never raises (errors → UNKNOWN) and is counted."""
        from rocketmq.client import TransactionMQProducer, TransactionStatus  # noqa: PLC0415 - loads librocketmq (native)

        in_flight = self.in_flight

        def safe_checker(msg: Any) -> Any:
            with in_flight:
                try:
                    return checker(msg)
                except BaseException:  # noqa: BLE001 - must never escape into ctypes
                    return TransactionStatus.UNKNOWN

        p = TransactionMQProducer(group, safe_checker)
        self.instance_names[id(p)] = instance = instance or unique("inst")
        set_producer_instance_name(p, instance)
        p.set_name_server_address(self.namesrv_addr)
        self._sign(p)
        p.start()
        self.started_at[id(p)] = time.monotonic()
        self.producers.append(p)
        return p

    def heartbeat(self, producer: Any) -> None:
        """Make the broker learn ``producer``'s group now, as txmsg's announcement does.

        A real broker sends check-backs only to channels it learned from HEART_BEAT.  librocketmq
        heartbeats 10 ms after start (usually before any send taught it a broker: to nobody) and
        then every 30 s.  A plain producer started on the same instance name (same client factory)
        heartbeats at once to every broker the factory knows, listing all of its groups.  Call it
        after the producer's first send; the helper producer is shut down by :meth:`close`.
        """
        self.producer(HEARTBEAT_GROUP, instance=self.instance_names[id(producer)])

    # -- consumers ------------------------------------------------------------------------------
    def consumer(
        self,
        group: str,
        topic: str,
        on_message: Callable[[Received], Any] | None = None,
        *,
        expression: str = "*",
        instance: str | None = None,
        properties: tuple[str, ...] = (),
        consume_from: str = "first",
        sync_pull: bool = False,
    ) -> list[Received]:
        """Start a push consumer; returns the (thread-safe appended) list of received messages.

        ``consume_from`` is txmsg's default, not librocketmq's: with CONSUME_FROM_LAST_OFFSET a
        rebalance's offset query that times out on a loaded machine starts the queue at its end
        and skips what was already there for good (docs/librocketmq-hazards.md #6), and a test
        counting deliveries then waits forever (a soak run of 2026-11-29 did).  ``sync_pull``
        takes the backend's workaround for a queue that stops being pulled after a drop and
        re-add (#5); it costs CPU while idle (the synchronous pull never long-polls), so only
        tests that must see every message of a long-lived consumer ask for it.

        Refuses names that librocketmq 2.1.0 would feed to printf as conversions (``%RETRY%SendCG``
        reads as ``%S``: a wide-string conversion of a garbage pointer - a segfault in ``start()``
        when the garbage is not a valid pointer, which happened in CI).
        """
        from rocketmq.client import ConsumeStatus, PushConsumer  # noqa: PLC0415 - loads librocketmq (native)

        hazard = consumer_names_hazard(group, topic)
        if hazard is not None:
            raise ValueError(
                f"consumer group {group!r} would crash librocketmq 2.1.0: {hazard}; rename it"
            )

        received: list[Received] = []
        in_flight = self.in_flight

        def callback(msg: Any) -> Any:
            with in_flight:
                try:
                    item = Received(
                        topic=_text(msg.topic),
                        body=msg.body if isinstance(msg.body, bytes) else _text(msg.body).encode(),
                        keys=_text(msg.keys),
                        tags=_text(msg.tags),
                        msg_id=_text(msg.id),
                        reconsume_times=int(msg.reconsume_times),
                        thread=threading.current_thread().name,
                        properties={name: _text(msg.get_property(name)) for name in properties},
                    )
                    result = on_message(item) if on_message is not None else None
                    received.append(item)
                    return result if result is not None else ConsumeStatus.CONSUME_SUCCESS
                except BaseException:  # noqa: BLE001
                    return ConsumeStatus.RECONSUME_LATER

        c = PushConsumer(group)
        c.set_instance_name(instance or unique("cinst"))
        c.set_name_server_address(self.namesrv_addr)
        self._sign(c)
        c.subscribe(topic, callback, expression)
        _protect(c._handle, consume_from=consume_from, sync_pull=sync_pull)
        enable_consumer_trace(c)
        c.start()
        self.started_at[id(c)] = time.monotonic()
        enable_consumer_trace(c, on=False)
        self.consumers.append(c)
        return received

    def consumer_when_routed(
        self, group: str, topic: str, *, timeout: float = 60.0, **options: Any
    ) -> list[Received]:
        """:meth:`consumer`, started once the name server routes ``topic`` (see :func:`has_route`):
        for topics a broker creates when it first needs them, such as the discard topic."""
        wait_until(
            lambda: has_route(self.namesrv_addr, topic),
            timeout=timeout,
            message=f"a route for {topic}",
        )
        return self.consumer(group, topic, **options)

    def _sign(self, client: Any) -> None:
        if self.credentials is not None:
            client.set_session_credentials(*self.credentials, "ALIYUN")

    # -- teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        self.in_flight.wait_idle()
        for c in self.consumers:
            _avoid_timer_window(self.started_at.get(id(c)), consumer=True)
            c.shutdown()
        self.in_flight.wait_idle()
        for p in self.producers:
            self.in_flight.wait_idle()
            _avoid_timer_window(self.started_at.get(id(p)))
            p.shutdown()
        self.consumers.clear()
        self.producers.clear()

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _protect(handle: Any, *, consume_from: str, sync_pull: bool) -> None:
    """The backend's settings against librocketmq 2.1.0's consumer hazards, on a raw consumer."""
    from txmsg_rocketmq.native import (  # noqa: PLC0415 - only with the real client
        CONSUME_FROM,
        load,
        set_consume_from,
        set_pull,
    )

    if consume_from not in CONSUME_FROM:
        raise ValueError(
            f"consume_from must be one of {sorted(CONSUME_FROM)}, not {consume_from!r}"
        )
    native = load()
    set_consume_from(native, int(handle), CONSUME_FROM[consume_from])
    if sync_pull:
        set_pull(native, int(handle), sync=True)


def _avoid_timer_window(started: float | None, *, consumer: bool = False) -> None:
    """The backend's guard (txmsg_rocketmq.timers), for the raw clients these helpers make."""
    from txmsg_rocketmq.timers import (  # noqa: PLC0415 - only with the real client
        CONSUMER_TIMER_PHASES,
        TIMER_PHASES,
        wait_until_quiet,
    )

    wait_until_quiet(started, CONSUMER_TIMER_PHASES if consumer else TIMER_PHASES)


def create_topic(
    namesrv_addr: str,
    topic: str,
    *,
    queues: int = 4,
    message_type: str | None = None,
    credentials: tuple[str, str] | None = None,
) -> None:
    """Create ``topic`` on every master (``txmsg topic create``), like an operator before a deployment.

    Needed wherever a test starts a consumer before the first send: as on a real 4.9.8 cluster, a
    topic that does not exist has no route, so such a consumer heartbeats to no broker and gets its
    queues only after librocketmq's next route refresh and heartbeat (up to 30 s).
    """
    args = [topic, "--namesrv", namesrv_addr, "--queues", str(queues)]
    if message_type:
        args += ["--type", message_type]
    if credentials is not None:  # an admin account of a broker with ACL
        args += ["--access-key", credentials[0], "--secret-key", credentials[1]]
    cli.create_topic.main(args, standalone_mode=False)


def has_route(namesrv_addr: str, topic: str) -> bool:
    """True once the name server routes ``topic`` (GET_ROUTEINFO_BY_TOPIC, request 105).

    Why: some topics come into being only when the broker needs them (the discard topic
    ``TRANS_CHECK_MAX_TIME_TOPIC`` at the first discard, on real brokers and the embedded one);
    a librocketmq consumer subscribed before that sees them only after its 30-s route refresh,
    so a test waits for the route and then starts its consumer.
    """
    from .codec import GET_ROUTEINFO_BY_TOPIC, SUCCESS  # noqa: PLC0415 - light helpers stay light
    from .rawclient import call  # noqa: PLC0415

    first = namesrv_addr.split(";", maxsplit=1)[0].strip()
    return call(first, GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code == SUCCESS


def create_group(
    namesrv_addr: str,
    group: str,
    *,
    orderly: bool = False,
    credentials: tuple[str, str] | None = None,
) -> None:
    """Create consumer ``group`` on every master as ``mqadmin updateSubGroup [-o true]`` does (request
    200 with a ``SubscriptionGroupConfig`` body).  An orderly listener on RocketMQ 5 needs its group
    created with ``orderly=True`` first: the proxy pops a group in order only then."""
    from . import fastjson  # noqa: PLC0415 - light helpers stay light at import
    from .codec import GET_BROKER_CLUSTER_INFO, SUCCESS  # noqa: PLC0415
    from .rawclient import call  # noqa: PLC0415
    from .subscription_groups import UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, group_config_body  # noqa: PLC0415

    info = fastjson.loads(call(namesrv_addr, GET_BROKER_CLUSTER_INFO).body)
    masters = [
        b["brokerAddrs"].get("0") or b["brokerAddrs"].get(0)
        for b in info["brokerAddrTable"].values()
    ]
    body = group_config_body(group, orderly=orderly)
    for addr in filter(None, masters):
        response = call(
            addr, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body, credentials=credentials
        )
        if response.code != SUCCESS:
            raise AssertionError(
                f"broker {addr} refused group {group}: {response.code} {response.remark}"
            )


def read_log(log_dir: Any, name: str = "transaction.log") -> str:
    path = os.path.join(str(log_dir), name)
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


__all__ = [
    "HEARTBEAT_GROUP",
    "Clients",
    "InFlight",
    "Received",
    "create_group",
    "create_topic",
    "enable_consumer_trace",
    "read_log",
    "set_producer_instance_name",
    "set_timeout_scale",
    "unique",
    "wait_until",
]
