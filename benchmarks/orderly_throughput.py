"""Orderly consumption: txmsg's orderly listener vs librocketmq's own orderly push consumer.

    python -m benchmarks.orderly_throughput [--messages 40000] [--keys 64] [--threads 1,8]
                                            [--rounds 3] [--poison-threads 8]
                                            [--poison-messages 40000] [--poison-rounds 5]
                                            [--poison-pairs together|apart]
                                            [--fifo-messages 3000]
                                            [--retries 3] [--retry-delay 0.05] [--pg URL]

One embedded broker (child process), one topic with 8 queues, pre-filled once with ``--messages``
messages sent with ``SendMessageOrderlyByShardingKey`` over ``--keys`` sharding keys (``order-000``
...; body ``<key>|<seq>``, each key's messages in sequence order, so each key lands on one queue in
order).  Every variant below is a fresh consumer group reading that topic from its first offset,
so all of them consume exactly the same messages; a variant's rate is messages / (last message's
arrival - first call of the listener), which leaves out start-up (rebalance, queue locks) and
shut-down; its *busy* rate also leaves out gaps of more than 0.25 s without any arrival or other
activity of the consumer (a queue that librocketmq starts pulling only at its 3 s timer, and
pauses of 0.3-0.9 s in which no queue gets anything, raw and txmsg alike; see ``Figures``).  Per
round, with 1 and with 8 consumer threads:

* **raw**: librocketmq 2.1.0's orderly push consumer through ctypes alone
  (``RegisterMessageCallbackOrderly``; the callback reads the body and the ``__SHARDINGKEY``
  property, notes the arrival and answers CONSUME_SUCCESS).  Library defaults except what a
  pre-filled topic and a clean shut-down need: CONSUME_FROM_FIRST_OFFSET and the message-trace
  start-up work-around (``txmsg_rocketmq.native``: library loading and C declarations only, no
  txmsg consumer code).
* **txmsg**: ``app.add_message_listener(..., orderly=True, session_factory=...)`` on the rocketmq
  backend with parking on a SQLite file (``txmsg.sqla``): every message goes through the orderly
  wrapper (the in-flight journal - librocketmq hazard #10, ``txmsg.sqla.journal``: two appends to
  the process's spool file, the table only for long-running, handed-back or dead consumers'
  messages - and is its key parked? - a set in memory, read again every 0.5 s and when a queue
  comes to the process), the listener notes the arrival the same way.
* **txmsgpg** (with ``--pg URL``, e.g. what ``bash scripts/pg.sh`` prints): the same with the
  listener's database on PostgreSQL.

Each round runs raw and txmsg (and txmsgpg) back to back (alternating the order); the ratio
txmsg/raw per thread count is the median of the rounds' ratios of busy rates (the 2-core machine is
noisy; nothing is compared across runs), and ``overhead_ms`` what txmsg adds per message, 1/txmsg -
1/raw in ms, median of the rounds (``overhead_ms`` for 1 thread, ``overhead8_ms`` for 8,
``overhead1pg_ms``/``overhead8pg_ms`` on PostgreSQL).  Goals (issue 38.5): t1 and t8 >= 0.15,
txmsg's own cost ``overhead_ms`` <= 0.1 ms per ordered message on one thread.  Beside it, on CPU
time rather than wall time: ``overhead_cpu_ms`` (``overhead8_cpu_ms``), the process's CPU per
message of txmsg minus raw's in the same round (all threads, from the first call until every
message arrived; the benchmark's own polling is in both), which the machine's load moves much
less than the rates.

Then, with ``--poison-threads`` consumer threads, **poisoned** vs **unpoisoned** txmsg runs
(``--poison-rounds`` pairs) on a topic of their own with ``--poison-messages`` messages over the
same keys (runs of ~1 s, as on the first topic, were mostly librocketmq's start-up pauses: the
pairs' ratios spread from 0.4 to 1.2).  The two sides of a pair run at the same time, each in a
child process of its own (``--poison-pairs together``; ``apart``: one after the other in this
process, alternating the order), because the machine's load swung run times of the same
unpoisoned consumer from 3.3 to 8 s within a minute.  In the poisoned one the listener
raises for the first message of key ``order-000``, so after ``--retries`` attempts
``--retry-delay`` s apart (defaults 3 and 0.05 s: 0.1 s of retrying in that queue's thread) the
key is parked with that message, and the key's later messages are parked behind it as they
arrive (with the journal: acknowledged once spooled, written into the parking table in batches
by the listener's writer thread, ``txmsg.orderly``).  The figure is the throughput of the *other*
keys (their messages / time from the first call of the listener to the last arrival of theirs),
poisoned / unpoisoned, on wall rates (goal >= 0.9; a stall the poison causes counts in full),
and beside it on busy rates (``poison_busy``: pauses in which no message arrived, no attempt of
the poisoned message ran and txmsg's orderly logger wrote nothing - the writer logs every
message it parks - are left out).  The poisoned run also checks that every message of the
poisoned key ended in the parked table, in order.

Every variant checks per-key order (a message arriving before an earlier one of its key is a
violation) and counts duplicates; the log of txmsg (parking warnings) goes to a file.  Final line::

    RESULT orderly_throughput raw1=<msgs/s> txmsg1=<msgs/s> [txmsgpg1=...] raw8=... txmsg8=...
        unpoisoned8=... poisoned8=... t1=<txmsg/raw> [t1pg=...] t8=<txmsg/raw> [t8pg=...]
        poison=<poisoned/unpoisoned> poison_busy=<...> fifo_t1=<txmsg5/raw5> overhead_ms=<ms>
        overhead_cpu_ms=<ms> [overhead1pg_ms=...] overhead8_ms=<ms> overhead8_cpu_ms=<ms>
        [overhead8pg_ms=...] fifo_overhead_ms=<ms>
        parked_check_ms=<ms> park_behind_ms=<ms>
        journal_ms=<ms> journal_table_ms=<ms> wrapper_ms=<ms> fifo_wrapper_ms=<ms>
        behind_cpu_ms=<ms> behind_sync_cpu_ms=<ms> violations=<n> incomplete=<n> ratio=<poison>

(rates: the best of the rounds - busy rates for raw/txmsg, wall rates for (un)poisoned; ratios:
medians of the pairs; ``ratio=`` is the figure the issue sets a goal for, poisoned/unpoisoned >=
0.9).  The rest explain the figures, each alone on a fresh SQLite file (medians of 300 calls):
``parked_check_ms`` the "is this key parked?" query (now read about every 0.5 s, not per message;
the rocketmq5 FIFO path still asks it per message), ``park_behind_ms`` parking a message behind a
parked key in its own transaction (the rocketmq5 FIFO consumer's messages of a parked key pay
it; with the journal, the rocketmq backend's pay a share of a batch), ``journal_ms`` the in-flight
journal's spool append and end (every message pays it), ``journal_table_ms`` its table path
(INSERT and DELETE, what every message paid before the spool; now only messages of keys with rows
there).  ``wrapper_ms`` and ``fifo_wrapper_ms``: txmsg's orderly handler alone (no broker, a
listener that does nothing, mean of 1 800 calls) as the rocketmq backend calls it and as the
rocketmq5 FIFO consumer calls it (no journal, a parked-key query per message) - the FIFO
consumer's figure beside the remoting one without a 5.x raw baseline to divide by.
Then (``--fifo-messages``, 0 skips it) the **rocketmq5** side, on an embedded broker of its own
with gRPC on: a FIFO topic with 8 queues pre-filled the same way (``__SHARDINGKEY`` is the
message group), read ``--rounds`` times by **raw5** (the official 5.x client alone: one
``SimpleConsumer`` thread receiving up to 32 messages and acking each in order, :class:`RawFifo`)
and **txmsg5** (an orderly listener on the rocketmq5 backend, 1 handler thread, parking on
SQLite, :class:`TxmsgFifo`), back to back: ``fifo_t1`` is txmsg5/raw5 on busy rates and
``fifo_overhead_ms`` 1/txmsg5 - 1/raw5 (medians of the pairs).
``behind_cpu_ms`` and ``behind_sync_cpu_ms``: the process's CPU time per message of a parked key
(journal on, 1 800 messages, until all are in the table) parked in batches as the rocketmq
backend does now and with a transaction per message before its acknowledgement, as before.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from txmsg_broker.app import BrokerProcess
from txmsg_broker.testing import create_group, unique
from txmsg_broker.testing import create_topic as create_typed_topic
from txmsg_rocketmq import native
from txmsg_rocketmq.timers import wait_until_quiet

from benchmarks._rmq_bench import ensure_client_log_dir, reached

QUEUES = 8
SHARDING_KEY = b"__SHARDINGKEY"
POISON_KEY = "order-000"


def key_name(index: int) -> str:
    return f"order-{index:03d}"


# ---- what a consumer saw --------------------------------------------------------------------------
@dataclass
class Arrivals:
    """Every message a consumer's callback saw: (body, sharding key property, perf_counter)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: list[tuple[bytes, str | None, float]] = field(default_factory=list)
    distinct: set[bytes] = field(default_factory=set)
    first_call: float | None = None
    first_cpu: float | None = None
    """The process's CPU time (all threads) at the first call: the start of ``Figures.cpu_ms``."""
    queues: dict[bytes, int] = field(default_factory=dict)
    """The queue of each body (txmsg variants: ``Message.queue_id``)."""
    poison_queue: int | None = None
    activity: list[float] = field(default_factory=list)
    """When the consumer did something that is no arrival: a failed attempt of the poisoned
    message, a line of txmsg's orderly log (a park, a message parked behind its key)."""

    def active(self) -> None:
        now = time.perf_counter()
        with self.lock:
            self.activity.append(now)

    def touch(self) -> None:
        """A handler call began (also for a call that then fails: the poisoned run's clock starts
        with the first call of any message)."""
        if self.first_call is None:
            now, cpu = time.perf_counter(), time.process_time()
            with self.lock:
                if self.first_call is None:
                    self.first_call, self.first_cpu = now, cpu

    def add(self, body: bytes, key: str | None, queue: int | None = None) -> None:
        now = time.perf_counter()
        with self.lock:
            if self.first_call is None:
                self.first_call, self.first_cpu = now, time.process_time()
            self.seen.append((body, key, now))
            self.distinct.add(body)
            if queue is not None:
                self.queues[body] = queue

    def count(self) -> int:
        with self.lock:
            return len(self.distinct)


IDLE_GAP = 0.25
"""Seconds without any arrival or other activity that count as idle, not as consumption time
(see :class:`Figures`)."""


class ActivityLog(logging.Handler):
    """Notes every record of txmsg's orderly logger as activity of the running variant: the
    writer of the messages parked behind a key logs each one it parked, so a stall while it
    works (or while the poisoned message is retried) counts as consumption time."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.target: Arrivals | None = None

    def emit(self, record: logging.LogRecord) -> None:
        del record
        target = self.target
        if target is not None:
            target.active()


ACTIVITY = ActivityLog()


@dataclass
class Figures:
    """One variant's result over the messages it was judged on.

    ``rate`` is wall-clock: messages / (first call -> last arrival).  ``busy_rate`` leaves out the
    gaps of more than :data:`IDLE_GAP` s in which nothing arrived at all and the consumer did
    nothing else either (no failed attempt, no line of txmsg's orderly log: see
    :class:`ActivityLog`): the consumer then had no message to work on - librocketmq now and
    then starts pulling a queue only at its factory's 3 s timer (one raw run took 3.2 s for what
    takes 0.3 s otherwise), and nearly every run of ~1 s stops everything for 0.3-0.9 s once,
    early on, in raw and txmsg runs alike - which measures start-up, not consumption.  Both
    ratios use busy rates; the poisoned/unpoisoned one is printed on wall rates too.
    """

    name: str
    rate: float
    messages: int
    seconds: float
    idle: float
    duplicates: int
    violations: int
    key_mismatches: int
    complete: bool
    queue_ends: dict[int, float] = field(default_factory=dict)
    """Per queue (txmsg variants), seconds from the first call to its last expected arrival."""
    poison_queue: int | None = None
    cpu_ms: float = 0.0
    """The process's CPU time per message (all threads: librocketmq's, the callbacks', this
    benchmark's polling) from the first call until every message had arrived, in ms: what a
    message costs, whatever share of the cores the machine's load left the consumer."""

    @property
    def busy_rate(self) -> float:
        busy = self.seconds - self.idle
        return self.messages / busy if busy > 0 else 0.0


def judge(
    name: str, arrivals: Arrivals, expected: set[bytes], complete: bool, cpu_end: float = 0.0
) -> Figures:
    """Rate over ``expected`` (first call of any message -> the last expected one's first
    arrival), duplicates, order violations and sharding-key mismatches among all arrivals."""
    with arrivals.lock:
        seen = list(arrivals.seen)
        start = arrivals.first_call
        first_cpu = arrivals.first_cpu
        activity = list(arrivals.activity)
        queues = dict(arrivals.queues)
        poison_queue = arrivals.poison_queue
    first_arrival: dict[bytes, float] = {}
    duplicates = violations = mismatches = 0
    done: dict[str, int] = {}  # key -> highest sequence applied so far
    for body, prop, at in seen:
        key, _, seq_text = body.decode().partition("|")
        if prop != key:
            mismatches += 1
        if body in first_arrival:
            duplicates += 1
            continue
        first_arrival[body] = at
        seq = int(seq_text)
        if seq != done.get(key, -1) + 1:
            violations += 1
        done[key] = max(seq, done.get(key, -1))
    got = sorted(first_arrival[b] for b in expected if b in first_arrival)
    seconds = (got[-1] - start) if got and start is not None else 0.0
    rate = len(got) / seconds if seconds > 0 else 0.0
    end = got[-1] if got else 0.0
    points = sorted([*got, *(t for t in activity if start is not None and start <= t <= end)])
    steps = [b - a for a, b in zip([start or 0.0, *points], points, strict=False)]
    idle = sum(step for step in steps if step > IDLE_GAP)
    queue_ends: dict[int, float] = {}
    for body in expected:
        queue = queues.get(body)
        if queue is not None and body in first_arrival and start is not None:
            queue_ends[queue] = max(queue_ends.get(queue, 0.0), first_arrival[body] - start)
    return Figures(
        name,
        rate,
        len(got),
        seconds,
        idle,
        duplicates,
        violations,
        mismatches,
        complete,
        queue_ends,
        poison_queue,
        (cpu_end - first_cpu) / len(got) * 1000 if got and first_cpu is not None else 0.0,
    )


# ---- the topic --------------------------------------------------------------------------------------
def create_topic(namesrv: str, topic: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "txmsg_broker",
            "topic",
            "create",
            topic,
            "--namesrv",
            namesrv,
            "--queues",
            str(QUEUES),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


def bodies_of(messages: int, keys: int) -> dict[str, list[bytes]]:
    """The bodies :func:`prefill` sends, per key, in order (the same for the same arguments)."""
    per_key: dict[str, list[bytes]] = {key_name(k): [] for k in range(keys)}
    for i in range(messages):
        key = key_name(i % keys)
        per_key[key].append(f"{key}|{len(per_key[key])}".encode())
    return per_key


def prefill(
    namesrv: str, topic: str, messages: int, keys: int, senders: int = 4
) -> dict[str, list[bytes]]:
    """Send ``messages`` bodies ``<key>|<seq>`` round-robin over ``keys`` sharding keys with the
    raw client's ``SendMessageOrderlyByShardingKey`` (it sets ``__SHARDINGKEY`` and hashes the key
    to a queue).  Each key is sent from one thread, in sequence order.  Returns the bodies per key."""
    from rocketmq.client import Message, Producer, SendStatus  # noqa: PLC0415 - loads librocketmq

    per_key = bodies_of(messages, keys)
    names = sorted(per_key)
    producer = Producer(unique("OrderlyBenchPG"))
    native.load().dll.SetProducerInstanceName(producer._handle, unique("orderly-fill").encode())
    producer.set_name_server_address(namesrv)
    producer.start()
    started = time.monotonic()
    errors: list[str] = []

    def send(mine: list[str]) -> None:
        longest = max((len(per_key[k]) for k in mine), default=0)
        for seq in range(longest):
            for key in mine:
                if seq < len(per_key[key]):
                    msg = Message(topic)
                    msg.set_body(per_key[key][seq])
                    for attempt in range(20):
                        try:
                            result = producer.send_orderly_with_sharding_key(msg, key)
                            break
                        except Exception as exc:  # noqa: BLE001 - "No route info" while the new topic's route spreads
                            if attempt == 19:
                                errors.append(f"{key}|{seq}: {exc}")
                                return
                            time.sleep(0.5)
                    if result.status != SendStatus.OK:
                        errors.append(f"{key}|{seq}: {result.status}")

    workers = [threading.Thread(target=send, args=(names[i::senders],)) for i in range(senders)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wait_until_quiet(started)
    with native.NATIVE_LOCK:
        producer.shutdown()
    if errors:
        raise RuntimeError(f"pre-fill: {len(errors)} sends failed, first: {errors[0]}")
    return per_key


# ---- raw: librocketmq's orderly push consumer through ctypes -------------------------------------
class RawOrderly:
    """librocketmq's orderly push consumer with a trivial callback, nothing of txmsg's consumer."""

    def __init__(self, namesrv: str, topic: str, threads: int, arrivals: Arrivals) -> None:
        lib = native.load()
        dll = lib.dll
        self.lib = lib

        def on_message(_consumer: int, msg: int) -> int:
            body = dll.GetMessageBody(msg) or b""
            key = dll.GetMessageProperty(msg, SHARDING_KEY)
            arrivals.add(body, key.decode() if key is not None else None)
            return native.E_CONSUME_SUCCESS

        self.callback = native.MESSAGE_CALLBACK(on_message)  # kept alive as long as the consumer
        with native.NATIVE_LOCK:
            handle = dll.CreatePushConsumer(unique("cg_orderly_raw").encode())
            self.handle = int(handle)
            for status, what in (
                (dll.SetPushConsumerNameServerAddress(handle, namesrv.encode()), "name server"),
                (
                    dll.SetPushConsumerInstanceName(handle, unique("orderly-raw").encode()),
                    "instance",
                ),
                (dll.SetPushConsumerThreadCount(handle, threads), "threads"),
                (dll.Subscribe(handle, topic.encode(), b"*"), "subscribe"),
                (dll.RegisterMessageCallbackOrderly(handle, self.callback), "callback"),
            ):
                if int(status) != native.OK:
                    raise RuntimeError(f"raw orderly consumer: {what} failed: {lib.last_error()}")
            native.set_consume_from(lib, handle, native.CONSUME_FROM["first"])
            if int(native.start_push_consumer(lib, handle)) != native.OK:
                raise RuntimeError(f"raw orderly consumer did not start: {lib.last_error()}")
        self.started = time.monotonic()

    def stop(self) -> None:
        wait_until_quiet(self.started)
        with native.NATIVE_LOCK:
            native.release_push_consumer(self.lib, self.handle, started=True)


# ---- txmsg: the orderly listener ------------------------------------------------------------------
class TxmsgOrderly:
    """A TxMsg app with one orderly listener (rocketmq backend, parking on SQLite)."""

    def __init__(
        self,
        namesrv: str,
        topic: str,
        threads: int,
        arrivals: Arrivals,
        workdir: Path,
        *,
        poison: bytes | None = None,
        retries: int,
        retry_delay: float,
        database: str | None = None,
    ) -> None:
        import txmsg.sqla  # noqa: PLC0415 - SQLAlchemy only for this variant
        from txmsg import TxMsg  # noqa: PLC0415
        from txmsg.config import TxMsgConfig  # noqa: PLC0415
        from txmsg.message import Message  # noqa: PLC0415

        self.group = unique("cg_orderly_txmsg")
        self.engine = txmsg.sqla.create_engine(
            database or f"sqlite:///{workdir / (self.group + '.db')}"
        )
        txmsg.sqla.create_tables(self.engine)
        self.session_factory = txmsg.sqla.make_session_factory(self.engine)

        def listener(message: Message) -> None:
            arrivals.touch()
            if message.sharding_key == POISON_KEY:
                arrivals.poison_queue = message.queue_id
            if message.body == poison:
                arrivals.active()
                raise RuntimeError(f"poisoned message {message.body!r}")
            arrivals.add(message.body, message.sharding_key, message.queue_id)

        config = TxMsgConfig(
            name_server=namesrv,
            client_log_dir=os.environ["ROCKETMQ_CLIENT_LOG_DIR"],
            instance_prefix=unique("orderly-txmsg"),
        )
        self.app = TxMsg(config, backend="rocketmq")
        self.app.add_message_listener(
            listener,
            topic=topic,
            group=self.group,
            concurrency=threads,
            orderly=True,
            session_factory=self.session_factory,
            max_orderly_retries=retries,
            orderly_retry_delay=retry_delay,
        )
        self.app.start()

    def parked(self, key: str) -> list[bytes]:
        """Bodies parked under ``key`` (in their original order)."""
        import txmsg.sqla  # noqa: PLC0415

        return [
            row.message.body
            for row in txmsg.sqla.parked_messages(self.session_factory, self.group, key)
        ]

    def stop(self) -> None:
        self.app.close(timeout=30)
        self.engine.dispose()


# ---- rocketmq5: FIFO message groups over gRPC ------------------------------------------------------
class RawFifo:
    """The official 5.x client alone: one ``SimpleConsumer`` of an orderly group on a FIFO topic,
    one thread receiving up to 32 messages and acking each in order (what a FIFO group needs at
    the least: a message of a group is acked before its group's next one is handled)."""

    def __init__(self, endpoint: str, topic: str, arrivals: Arrivals, namesrv: str) -> None:
        from txmsg_rocketmq5._client import (  # noqa: PLC0415 - the 5.x client, for this variant
            ClientConfiguration,
            Credentials,
            FilterExpression,
            SimpleConsumer,
        )

        group = unique("cg_fifo_raw")
        create_group(namesrv, group, orderly=True)
        self.client = SimpleConsumer(
            ClientConfiguration(endpoint, Credentials("", ""), request_timeout=3),
            group,
            {topic: FilterExpression("*")},
            await_duration=5,
        )
        self.client.startup()
        self.arrivals = arrivals
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raw-fifo", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                received = self.client.receive(32, 60)
            except Exception:  # an empty long poll may end in a timeout: receive again
                logging.getLogger(__name__).debug("receive failed", exc_info=True)
                continue
            for raw in received or ():
                self.arrivals.add(bytes(raw.body), raw.message_group)
                self.client.ack(raw)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.client.shutdown()


class TxmsgFifo:
    """A TxMsg app on the rocketmq5 backend with one orderly listener (concurrency 1, parking on
    SQLite): txmsg's FIFO consumer (receive loop, per-group handling, ack) and the orderly
    handler (no journal; "is the key parked?" asked of the database for every message)."""

    def __init__(
        self, endpoint: str, topic: str, arrivals: Arrivals, namesrv: str, workdir: Path
    ) -> None:
        import txmsg.sqla  # noqa: PLC0415
        from txmsg import TxMsg  # noqa: PLC0415
        from txmsg.config import TxMsgConfig  # noqa: PLC0415
        from txmsg.message import Message  # noqa: PLC0415

        group = unique("cg_fifo_txmsg")
        create_group(namesrv, group, orderly=True)
        self.engine = txmsg.sqla.create_engine(f"sqlite:///{workdir / (group + '.db')}")
        txmsg.sqla.create_tables(self.engine)

        def listener(message: Message) -> None:
            arrivals.add(message.body, message.sharding_key)

        self.app = TxMsg(TxMsgConfig(backend="rocketmq5", endpoints=endpoint))
        self.app.add_message_listener(
            listener,
            topic=topic,
            group=group,
            concurrency=1,
            orderly=True,
            session_factory=txmsg.sqla.make_session_factory(self.engine),
        )
        self.app.start()

    def stop(self) -> None:
        self.app.close(timeout=30)
        self.engine.dispose()


def fifo_figures(
    workdir: Path, messages: int, keys: int, rounds: int, timeout: float
) -> tuple[list[float], list[float], int, int]:
    """raw5 vs txmsg5 on a broker of their own with gRPC on, back to back, alternating order
    per round: (txmsg5/raw5 busy-rate ratios, 1/txmsg5 - 1/raw5 in ms, order violations,
    incomplete runs)."""
    broker = BrokerProcess(str(workdir / "data5"), str(workdir / "logs5"), grpc_port=0).start()
    ratios: list[float] = []
    costs: list[float] = []
    violations = incomplete = 0
    try:
        endpoint = broker.grpc_endpoint
        if endpoint is None:
            raise RuntimeError("the embedded broker did not open its gRPC endpoint")
        topic = unique("OrderlyFifo")
        create_typed_topic(broker.namesrv_addr, topic, queues=QUEUES, message_type="FIFO")
        per_key = prefill(broker.namesrv_addr, topic, messages, keys)
        everything = {b for bodies in per_key.values() for b in bodies}
        print(
            f"rocketmq5 FIFO over gRPC (embedded broker, endpoint {endpoint}): topic {topic}, "
            f"{len(everything)} messages over {keys} message groups, 1 handler thread",
            flush=True,
        )
        variants: list[tuple[str, Callable[[Arrivals], Any]]] = [
            ("raw5", lambda a: RawFifo(endpoint, topic, a, broker.namesrv_addr)),
            ("txmsg5", lambda a: TxmsgFifo(endpoint, topic, a, broker.namesrv_addr, workdir)),
        ]
        for round_no in range(rounds):
            order = variants if round_no % 2 == 0 else variants[::-1]
            got: dict[str, Figures] = {}
            for name, start in order:
                figures, _ = run_variant(f"{name} 1 thr", start, everything, timeout)
                show(figures)
                got[name] = figures
                violations += figures.violations
                incomplete += not figures.complete
            if got["raw5"].busy_rate > 0 and got["txmsg5"].busy_rate > 0:
                ratios.append(got["txmsg5"].busy_rate / got["raw5"].busy_rate)
                costs.append(per_message_ms(got["txmsg5"], got["raw5"]))
    finally:
        broker.stop()
    return ratios, costs, violations, incomplete


def parking_costs(workdir: Path, calls: int = 300) -> tuple[float, float, float, float]:
    """Median milliseconds, on a fresh SQLite file, of ``is_parked`` (the query the handler
    asked before every message until the parked keys were kept in memory; now it runs about
    every 0.5 s), of ``park_behind`` (every message of a parked key pays it: one write
    transaction), of the in-flight journal around a message as every message pays it now (the
    spool's two appends, ``admit`` + ``done``, ``txmsg.sqla.journal``) and of its table path
    (INSERT and DELETE, two transactions: what every message paid before, and what messages of a
    key with rows in the table - a dead consumer's leftover - still pay)."""
    import txmsg.sqla  # noqa: PLC0415
    from txmsg.message import Message  # noqa: PLC0415
    from txmsg.sqla import parking  # noqa: PLC0415
    from txmsg.sqla.journal import InflightJournal, Ticket  # noqa: PLC0415
    from txmsg.sqla.parking import parked_message_key  # noqa: PLC0415

    engine = txmsg.sqla.create_engine(f"sqlite:///{workdir / 'parking-costs.db'}")
    txmsg.sqla.create_tables(engine)
    sessions = txmsg.sqla.make_session_factory(engine)

    def message(i: int, key: str = POISON_KEY) -> Message:
        return Message(
            topic="bench",
            body=f"{key}|{i}".encode(),
            message_id=f"m{i}",
            properties={"UNIQ_KEY": f"m{i}", "__SHARDINGKEY": key},
            sharding_key=key,
            queue_id=i % QUEUES,
            queue_offset=i,
        )

    checks, parks = [], []
    for i in range(calls):
        t0 = time.perf_counter()
        parking.is_parked(sessions, "bench", key_name(1 + i % 63))
        checks.append(time.perf_counter() - t0)
    parking.park(sessions, "bench", message(0), error="poisoned", attempts=3)
    for i in range(1, calls + 1):
        t0 = time.perf_counter()
        parking.park_behind(sessions, "bench", message(i))
        parks.append(time.perf_counter() - t0)
    journal, spooled, tabled = InflightJournal(sessions, "bench-journal"), [], []
    journal.refresh()
    for i in range(calls):
        m = message(i, key_name(1 + i % 63))
        t0 = time.perf_counter()
        ticket = journal.admit(m).ticket
        if ticket is None or ticket.seq is None:
            raise RuntimeError("the journal did not spool a message of a key without rows")
        journal.done(ticket)
        spooled.append(time.perf_counter() - t0)
    for i in range(calls, 2 * calls):
        m = message(i, key_name(1 + i % 63))
        t0 = time.perf_counter()
        entry = journal.enter(m)
        if entry.row_id is None:
            raise RuntimeError("the journal refused a new message: nothing else writes this file")
        journal.done(Ticket(m, parked_message_key(m), row_id=entry.row_id))
        tabled.append(time.perf_counter() - t0)
    journal.close()
    engine.dispose()
    return (
        statistics.median(checks) * 1000,
        statistics.median(parks) * 1000,
        statistics.median(spooled) * 1000,
        statistics.median(tabled) * 1000,
    )


def wrapper_costs(workdir: Path, calls: int = 2000) -> tuple[float, float, float, float]:
    """Milliseconds per message of txmsg's orderly handler alone (a listener that does nothing,
    no broker), on a fresh SQLite file.  Wall time (mean) as the rocketmq backend calls it
    (in-flight journal on, messages carry their queue) and as the rocketmq5 FIFO consumer calls
    it (no journal: the client acks each message itself; no queue: any consumer may get a
    message group's next message, so "is the key parked?" stays a query per message).  Then the
    CPU time of the whole process per message of a *parked* key, journal on, until every one is
    in the parking table: as the rocketmq backend parks them now (acknowledged once spooled,
    written in batches by the listener's writer thread) and one transaction per message before
    its acknowledgement (as before; what the FIFO consumer still does).  CPU time, because in a
    loop with nothing else to do the consumer's thread mostly waits for the writer's share of
    the GIL, which says nothing about what a message costs."""
    import txmsg.sqla  # noqa: PLC0415
    from txmsg.consumer import build_consumer_spec  # noqa: PLC0415
    from txmsg.message import Message  # noqa: PLC0415
    from txmsg.orderly import OrderlyHandler, orderly_handler  # noqa: PLC0415
    from txmsg.sqla import parking  # noqa: PLC0415
    from txmsg.sqla.journal import InflightJournal  # noqa: PLC0415

    def listener(message: Message) -> None:
        del message

    results = []
    for name, journal, queued in (
        ("remoting", True, True),
        ("fifo", False, False),
        ("behind", True, True),
        ("behind-sync", True, True),
    ):
        engine = txmsg.sqla.create_engine(f"sqlite:///{workdir / f'wrapper-{name}.db'}")
        txmsg.sqla.create_tables(engine)
        sessions = txmsg.sqla.make_session_factory(engine)
        spec = build_consumer_spec(
            listener, topic="bench", group=f"bench-{name}", orderly=True, session_factory=sessions
        )
        if name == "behind-sync":  # no park_behind_linger: one transaction per message
            handler = OrderlyHandler(spec, sessions, (), InflightJournal(sessions, spec.group))
            handler.start()
        else:
            handler = orderly_handler(spec, journal=journal)
        parked_key = name.startswith("behind")
        batch = []
        for i in range(calls):
            key = POISON_KEY if parked_key else key_name(i % 64)
            batch.append(
                Message(
                    topic="bench",
                    body=f"{key}|{i}".encode(),
                    message_id=f"m{i}",
                    properties={"UNIQ_KEY": f"m{i}", "__SHARDINGKEY": key},
                    sharding_key=key,
                    queue_id=(i % QUEUES) if queued else None,
                    queue_offset=i if queued else None,
                )
            )
        if parked_key:
            parking.park(sessions, spec.group, batch[0], error="poisoned", attempts=3)
        for message in batch[: calls // 10]:  # warm-up: snapshots read, spool file open
            handler(message)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for message in batch[calls // 10 :]:
            if not handler(message):
                raise RuntimeError(f"the {name} handler refused a message")
        wall = time.perf_counter() - t0
        handler.close()  # the batch's last transaction
        cpu = time.process_time() - cpu0
        results.append((cpu if parked_key else wall) / (calls - calls // 10) * 1000)
        if parked_key:
            parked = txmsg.sqla.parked_messages(sessions, spec.group, POISON_KEY)
            if [row.message_key for row in parked] != [m.message_id for m in batch]:
                raise RuntimeError(f"{name}: parked messages lost or out of order")
        engine.dispose()
    return results[0], results[1], results[2], results[3]


def per_message_ms(txmsg: Figures, raw: Figures) -> float:
    """What txmsg adds to each message, in ms: 1/txmsg - 1/raw (busy rates, one round's pair)."""
    if txmsg.busy_rate <= 0 or raw.busy_rate <= 0:
        return float("nan")
    return (1 / txmsg.busy_rate - 1 / raw.busy_rate) * 1000


# ---- driving one variant --------------------------------------------------------------------------
def run_variant(
    name: str,
    start: Callable[[Arrivals], Any],
    expected: set[bytes],
    timeout: float,
    settle: Callable[[Any], bool] | None = None,
) -> tuple[Figures, Any]:
    """Start a consumer, wait until every ``expected`` body arrived (and ``settle`` holds), stop it."""
    arrivals = Arrivals()
    ACTIVITY.target = arrivals
    consumer = start(arrivals)
    try:
        complete = reached(lambda: expected <= arrivals.distinct, timeout)
        cpu_end = time.process_time()
        if complete and settle is not None:
            complete = reached(lambda: settle(consumer), timeout)
        figures = judge(name, arrivals, expected, complete, cpu_end)
        return figures, consumer
    finally:
        ACTIVITY.target = None
        consumer.stop()


POISON_CHILD = "--poison-child"
"""First argument of a child process that runs one side of a poisoned/unpoisoned pair."""


def poison_child(spec: dict[str, Any]) -> int:
    """One side of a pair, in a process of its own: consume, judge, print the figures as JSON."""
    ensure_client_log_dir()
    logging.basicConfig(level=logging.WARNING, filename=spec["log"])
    logging.getLogger("txmsg.orderly").addHandler(ACTIVITY)
    per_key = bodies_of(spec["messages"], spec["keys"])
    poisoned_key = per_key[POISON_KEY]
    others = {b for key, bodies in per_key.items() if key != POISON_KEY for b in bodies}
    poison = poisoned_key[0] if spec["poisoned"] else None

    def settle(consumer: TxmsgOrderly) -> bool:
        return consumer.parked(POISON_KEY) == poisoned_key

    figures, consumer = run_variant(
        spec["name"],
        lambda arrivals: TxmsgOrderly(
            spec["namesrv"],
            spec["topic"],
            spec["threads"],
            arrivals,
            Path(spec["workdir"]),
            poison=poison,
            retries=spec["retries"],
            retry_delay=spec["retry_delay"],
        ),
        others,
        spec["timeout"],
        settle if poison is not None else None,
    )
    parked = consumer.parked(POISON_KEY) if poison is not None else poisoned_key
    print(
        json.dumps(
            {
                "figures": asdict(figures),
                "parked": len(parked),
                "parked_all_in_order": parked == poisoned_key,
                "parked_in_order": parked == poisoned_key[: len(parked)],
            }
        ),
        flush=True,
    )
    return 0


def poison_pair(specs: dict[str, dict[str, Any]], timeout: float) -> dict[str, tuple[Figures, str]]:
    """Run the sides of a pair at the same time, each in a child process (so that the machine's
    load, which swings by a factor of two within seconds here, hits both alike and neither shares
    the other's GIL); their figures and what each says about the parked rows."""
    children = {
        name: subprocess.Popen(
            [sys.executable, "-m", "benchmarks.orderly_throughput", POISON_CHILD, json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, spec in specs.items()
    }
    got: dict[str, tuple[Figures, str]] = {}
    for name, child in children.items():
        out, err = child.communicate(timeout=timeout * 3 + 120)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if child.returncode != 0 or not lines:
            raise RuntimeError(f"the {name} side failed ({child.returncode}): {err[-2000:]}")
        data = json.loads(lines[-1])
        fields = data["figures"]
        fields["queue_ends"] = {int(q): t for q, t in fields["queue_ends"].items()}
        note = ""
        if not data["parked_all_in_order"]:
            note = f"parked rows of {POISON_KEY}: {data['parked']}" + (
                "" if data["parked_in_order"] else " OUT OF ORDER"
            )
        got[name] = (Figures(**fields), note)
    return got


def report_queues(figures: Figures) -> None:
    """When the poisoned key's queue finished its other keys, beside the other queues."""
    ends = figures.queue_ends
    if figures.poison_queue in ends and len(ends) > 1:
        mine = ends[figures.poison_queue]
        rest = [t for q, t in ends.items() if q != figures.poison_queue]
        print(
            f"  the other keys of {POISON_KEY}'s queue done at {mine:.2f} s, "
            f"the other queues at {min(rest):.2f}-{max(rest):.2f} s",
            flush=True,
        )


_COST_NAMES = {"overhead1": "overhead_ms", "overhead1_cpu": "overhead_cpu_ms"}
"""RESULT names of the one-thread costs (the goal's figures); the others are ``<key>_ms``."""


def show(f: Figures) -> None:
    flags = "" if f.complete else "  INCOMPLETE (timed out)"
    print(
        f"  {f.name:<18} {f.rate:>7.0f} msgs/s (busy {f.busy_rate:>6.0f})  {f.messages:>6} msgs in "
        f"{f.seconds:5.2f} s (idle {f.idle:4.2f}; CPU {f.cpu_ms:.3f} ms a message)  "
        f"dup {f.duplicates}  order violations {f.violations}  key mismatches {f.key_mismatches}{flags}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages",
        type=int,
        default=40000,
        help="messages in the topic (default 40000: with 10000 a txmsg run's first seconds - its "
        "consumer's start-up, paid once - were most of its CPU time, 0.24-0.45 ms a message "
        "against 0.09 over 60000)",
    )
    parser.add_argument("--keys", type=int, default=64, help="sharding keys (default 64)")
    parser.add_argument("--threads", default="1,8", help="consumer thread counts (default 1,8)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="back-to-back pairs per figure (default 3)"
    )
    parser.add_argument(
        "--poison-threads",
        type=int,
        default=8,
        help="consumer threads of the poisoned/unpoisoned runs (default 8; 0 skips them)",
    )
    parser.add_argument(
        "--poison-rounds",
        type=int,
        default=5,
        help="poisoned/unpoisoned pairs (default 5; 0: as many as --rounds)",
    )
    parser.add_argument(
        "--poison-pairs",
        choices=("together", "apart"),
        default="together",
        help="run the two sides of a poisoned/unpoisoned pair at the same time, each in a child "
        "process (default), or one after the other in this process",
    )
    parser.add_argument(
        "--poison-messages",
        type=int,
        default=40000,
        help="messages in the poisoned/unpoisoned runs' own topic (default 40000; 0: those of "
        "the throughput runs' topic)",
    )
    parser.add_argument(
        "--fifo-messages",
        type=int,
        default=3000,
        help="messages of the rocketmq5 FIFO runs (default 3000; 0 skips them)",
    )
    parser.add_argument("--retries", type=int, default=3, help="max_orderly_retries (default 3)")
    parser.add_argument(
        "--retry-delay",
        type=float,
        default=0.05,
        help="orderly_retry_delay in seconds (default 0.05)",
    )
    parser.add_argument(
        "--only",
        choices=("all", "raw", "txmsg"),
        default="all",
        help="raw or txmsg alone (no ratios; for trying one side)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="per-variant limit in seconds")
    parser.add_argument(
        "--pg",
        default=os.environ.get("TXMSG_BENCH_PG_URL"),
        metavar="URL",
        help="also run the txmsg variant with its database on this PostgreSQL URL "
        "(default $TXMSG_BENCH_PG_URL; e.g. what `bash scripts/pg.sh` prints)",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [POISON_CHILD]:
        return poison_child(json.loads(argv[1]))
    args = parser.parse_args(argv)
    thread_counts = [int(x) for x in args.threads.split(",") if x.strip()]
    ensure_client_log_dir()
    workdir = Path(tempfile.mkdtemp(prefix="orderly-throughput-"))
    log_file = workdir / "txmsg.log"
    logging.basicConfig(level=logging.WARNING, filename=str(log_file))
    logging.getLogger("txmsg.orderly").addHandler(ACTIVITY)

    broker = BrokerProcess(str(workdir / "data"), str(workdir / "logs")).start()
    topic = unique("OrderlyBench")
    create_topic(broker.namesrv_addr, topic)
    per_key = prefill(broker.namesrv_addr, topic, args.messages, args.keys)
    everything = {b for bodies in per_key.values() for b in bodies}
    others = everything - set(per_key[POISON_KEY])
    poison_first = per_key[POISON_KEY][0]
    print(
        f"broker {broker.namesrv_addr}; topic {topic}: {QUEUES} queues, {len(everything)} messages over "
        f"{args.keys} sharding keys; {args.rounds} rounds; txmsg log {log_file}",
        flush=True,
    )

    def raw(threads: int) -> Callable[[Arrivals], Any]:
        return lambda arrivals: RawOrderly(broker.namesrv_addr, topic, threads, arrivals)

    def tx(
        threads: int,
        poison: bytes | None = None,
        database: str | None = None,
        on_topic: str = topic,
    ) -> Callable[[Arrivals], Any]:
        return lambda arrivals: TxmsgOrderly(
            broker.namesrv_addr,
            on_topic,
            threads,
            arrivals,
            workdir,
            poison=poison,
            retries=args.retries,
            retry_delay=args.retry_delay,
            database=database,
        )

    rates: dict[str, list[float]] = {}
    ratios: dict[str, float] = {}
    overheads: dict[str, list[float]] = {}
    violations = 0
    incomplete = 0
    try:
        for threads in thread_counts:
            pair_ratios: list[float] = []
            pg_ratios: list[float] = []
            for round_no in range(args.rounds):
                order = [("raw", raw(threads)), ("txmsg", tx(threads))]
                if args.pg:
                    order.append(("txmsgpg", tx(threads, database=args.pg)))
                if args.only != "all":
                    order = [o for o in order if o[0].startswith(args.only)]
                if round_no % 2:
                    order.reverse()
                got: dict[str, Figures] = {}
                for name, start in order:
                    figures, _ = run_variant(
                        f"{name} {threads} thr", start, everything, args.timeout
                    )
                    show(figures)
                    got[name] = figures
                    rates.setdefault(f"{name}{threads}", []).append(figures.busy_rate)
                    violations += figures.violations
                    incomplete += not figures.complete
                if "raw" in got and "txmsg" in got and got["raw"].busy_rate > 0:
                    pair_ratios.append(got["txmsg"].busy_rate / got["raw"].busy_rate)
                    overheads.setdefault(f"overhead{threads}", []).append(
                        per_message_ms(got["txmsg"], got["raw"])
                    )
                    overheads.setdefault(f"overhead{threads}_cpu", []).append(
                        got["txmsg"].cpu_ms - got["raw"].cpu_ms
                    )
                if "raw" in got and "txmsgpg" in got and got["raw"].busy_rate > 0:
                    pg_ratios.append(got["txmsgpg"].busy_rate / got["raw"].busy_rate)
                    overheads.setdefault(f"overhead{threads}pg", []).append(
                        per_message_ms(got["txmsgpg"], got["raw"])
                    )
            for suffix, values in (("", pair_ratios), ("pg", pg_ratios)):
                if not values:
                    continue
                name = f"t{threads}{suffix}"
                ratios[name] = statistics.median(values)
                cost = statistics.median(overheads[f"overhead{threads}{suffix}"])
                print(
                    f"threads {threads}: txmsg{' (PostgreSQL)' if suffix else ''}/raw = "
                    f"{ratios[name]:.3f} (median of {', '.join(f'{r:.2f}' for r in values)}); "
                    f"txmsg adds {cost:.3f} ms per message (1/txmsg - 1/raw, median)",
                    flush=True,
                )

        if args.poison_threads > 0 and args.only in ("all", "txmsg"):
            n = args.poison_threads
            poison_topic = topic
            if args.poison_messages:
                poison_topic = unique("OrderlyPoison")
                create_topic(broker.namesrv_addr, poison_topic)
                per_key = prefill(
                    broker.namesrv_addr, poison_topic, args.poison_messages, args.keys
                )
                everything = {b for bodies in per_key.values() for b in bodies}
                others = everything - set(per_key[POISON_KEY])
                poison_first = per_key[POISON_KEY][0]
            poisoned_key = per_key[POISON_KEY]
            print(
                f"topic {poison_topic}: {len(everything)} messages; poisoned key {POISON_KEY} "
                f"({len(poisoned_key)} messages; the first always fails): "
                f"max_orderly_retries={args.retries}, orderly_retry_delay={args.retry_delay:g} s, "
                f"{n} threads; throughput of the other {len(others)} messages",
                flush=True,
            )
            pair_ratios = []
            wall_ratios: list[float] = []
            for round_no in range(args.poison_rounds or args.rounds):
                order = [
                    ("unpoisoned", tx(n, on_topic=poison_topic)),
                    ("poisoned", tx(n, poison_first, on_topic=poison_topic)),
                ]
                if round_no % 2:
                    order.reverse()
                got = {}
                together: dict[str, tuple[Figures, str]] = {}
                if args.poison_pairs == "together":
                    together = poison_pair(
                        {
                            name: {
                                "name": f"{name} {n} thr",
                                "poisoned": name == "poisoned",
                                "namesrv": broker.namesrv_addr,
                                "topic": poison_topic,
                                "messages": len(everything),
                                "keys": args.keys,
                                "threads": n,
                                "workdir": str(workdir),
                                "log": str(workdir / f"txmsg-{name}-{round_no}.log"),
                                "retries": args.retries,
                                "retry_delay": args.retry_delay,
                                "timeout": args.timeout,
                            }
                            for name, _ in order
                        },
                        args.timeout,
                    )
                for name, start in order:
                    if together:
                        figures, note = together[name]
                        show(figures)
                        report_queues(figures)
                        if note:
                            print(f"  {note}")
                            violations += 1
                        got[name] = figures
                        rates.setdefault(f"{name}{n}", []).append(figures.rate)
                        violations += figures.violations
                        incomplete += not figures.complete
                        continue
                    settle = (
                        (lambda c: c.parked(POISON_KEY) == poisoned_key)
                        if name == "poisoned"
                        else None
                    )
                    figures, consumer = run_variant(
                        f"{name} {n} thr", start, others, args.timeout, settle
                    )
                    show(figures)
                    report_queues(figures)
                    if name == "poisoned":
                        parked = consumer.parked(POISON_KEY)
                        if parked != poisoned_key:
                            print(
                                f"  parked rows of {POISON_KEY}: {len(parked)} of {len(poisoned_key)}"
                                f"{'' if parked == poisoned_key[: len(parked)] else ' OUT OF ORDER'}"
                            )
                            violations += 1
                    got[name] = figures
                    rates.setdefault(f"{name}{n}", []).append(figures.rate)  # wall: stalls count
                    violations += figures.violations
                    incomplete += not figures.complete
                if got["unpoisoned"].busy_rate > 0:
                    pair_ratios.append(got["poisoned"].busy_rate / got["unpoisoned"].busy_rate)
                if got["unpoisoned"].rate > 0:
                    wall_ratios.append(got["poisoned"].rate / got["unpoisoned"].rate)
            ratios["poison"] = statistics.median(wall_ratios)
            ratios["poison_busy"] = statistics.median(pair_ratios)
            print(
                f"other keys: poisoned/unpoisoned = {ratios['poison']:.3f} (wall rates, median of "
                f"{', '.join(f'{r:.2f}' for r in wall_ratios)}; goal >= 0.9), "
                f"{ratios['poison_busy']:.3f} on busy rates (median of "
                f"{', '.join(f'{r:.2f}' for r in pair_ratios)})",
                flush=True,
            )
        if args.fifo_messages > 0 and args.only == "all":
            fifo_ratios, fifo_costs, fifo_violations, fifo_incomplete = fifo_figures(
                workdir, args.fifo_messages, args.keys, args.rounds, args.timeout
            )
            violations += fifo_violations
            incomplete += fifo_incomplete
            if fifo_ratios:
                ratios["fifo_t1"] = statistics.median(fifo_ratios)
                overheads["fifo_overhead"] = fifo_costs
                print(
                    f"rocketmq5 FIFO: txmsg/raw = {ratios['fifo_t1']:.3f} (median of "
                    f"{', '.join(f'{r:.2f}' for r in fifo_ratios)}); txmsg adds "
                    f"{statistics.median(fifo_costs):.3f} ms per message (1/txmsg - 1/raw, median)",
                    flush=True,
                )
        check_ms, park_ms, journal_ms, table_ms = (
            parking_costs(workdir) if args.only in ("all", "txmsg") else (0.0, 0.0, 0.0, 0.0)
        )
        wrapper_ms, fifo_ms, behind_ms, behind_sync_ms = (
            wrapper_costs(workdir) if args.only in ("all", "txmsg") else (0.0, 0.0, 0.0, 0.0)
        )
        print(
            f"txmsg's orderly handler alone (no broker, trivial listener, SQLite): "
            f"{wrapper_ms:.3f} ms per message as the rocketmq backend calls it (journal on), "
            f"{fifo_ms:.3f} ms as the rocketmq5 FIFO consumer does (a parked-key query each); "
            f"a message of a parked key, journal on, costs {behind_ms:.3f} ms of CPU parked in "
            f"batches, {behind_sync_ms:.3f} ms with a transaction each",
            flush=True,
        )
        print(
            f"alone, SQLite: is the key parked? {check_ms:.3f} ms (a query; now about every "
            f"0.5 s); park behind a parked key {park_ms:.3f} ms (one transaction: the rocketmq5 "
            f"FIFO consumer pays it per message of a parked key, the rocketmq one per batch); "
            f"in-flight journal, spool append + end {journal_ms:.3f} ms (every message); its "
            f"table path, INSERT + DELETE {table_ms:.3f} ms (messages of keys with leftover rows)",
            flush=True,
        )
    finally:
        broker.stop()
    best = " ".join(f"{name}={max(values):.0f}" for name, values in rates.items())
    parts = " ".join(f"{name}={value:.3f}" for name, value in ratios.items())
    costs = " ".join(
        f"{_COST_NAMES.get(name, name + '_ms')}={statistics.median(values):.3f}"
        for name, values in overheads.items()
    )
    print(
        f"RESULT orderly_throughput {best} {parts} {costs} parked_check_ms={check_ms:.3f} "
        f"park_behind_ms={park_ms:.3f} journal_ms={journal_ms:.3f} journal_table_ms={table_ms:.3f} "
        f"wrapper_ms={wrapper_ms:.3f} fifo_wrapper_ms={fifo_ms:.3f} behind_cpu_ms={behind_ms:.3f} "
        f"behind_sync_cpu_ms={behind_sync_ms:.3f} "
        f"violations={violations} incomplete={incomplete} ratio={ratios.get('poison', 0.0):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
