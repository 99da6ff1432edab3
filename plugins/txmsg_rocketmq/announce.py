"""Making a new producer instance known to the brokers at once instead of after up to 30 s.

Why: a broker sends check-backs only to channels it learned from a ``HEART_BEAT`` that listed
the group (a real broker does not learn producers from sends).  librocketmq heartbeats right
after ``start()``, but its broker table is still empty then (it fills it from topic routes), so
that heartbeat goes nowhere; the next one is 30 s later (``MQClientFactory::startScheduledTask``).
A producer that never sends never learns a route at all, so after a restart it would never get
the check-backs of its predecessor's pending transactions.

The C API has no "send heartbeat" call, but two client starts do heartbeat immediately, and a
client created with the same instance name shares the producer's ``MQClientFactory`` (the
factory is keyed by ``ip@pid#instanceName``), so that heartbeat carries our producer group too:

* ``announce_now(instance, topics)`` - a short-lived push consumer on the same instance name,
  subscribed to the group's topics with a tag no message carries.  Its start fetches the topics'
  routes (filling the broker table) and calls ``sendHeartbeatToAllBroker``; it is shut down
  right away (the shared factory stays up because our producer is still registered in it) and
  destroyed only after the instance itself is shut down (see ``_via_consumer``).
  Leaves a consumer group ``TXMSG_ANNOUNCE_<group>`` in the broker's tables.
* ``announce_later(instance)`` - after a send has taught the instance its brokers, a plain
  producer of group ``TXMSG_ANNOUNCE`` on the same instance name is started (start sends a
  heartbeat to all known brokers) and shut down (unregistering only ``TXMSG_ANNOUNCE``).  Runs on
  a background thread so the send that triggered it is not delayed.

Both go through the instance's gate as a "send", so ``close()`` waits for them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .callbacks import guarded
from .names import printf_hazard, safe_component
from .native import (
    E_CONSUME_SUCCESS,
    MESSAGE_CALLBACK,
    NATIVE_LOCK,
    OK,
    Native,
    release_push_consumer,
    start_push_consumer,
)

if TYPE_CHECKING:
    from .pool import ProducerInstance

log = logging.getLogger("txmsg.rocketmq")

ANNOUNCE_PRODUCER_GROUP = "TXMSG_ANNOUNCE"
NO_MESSAGE_TAG = "TXMSG_ANNOUNCE_NO_MESSAGES"


class Announcer:
    """Sends first heartbeats for producer instances (see module docstring)."""

    def __init__(self, native: Native, name_server: str) -> None:
        self.native = native
        self.name_server = name_server
        self._queue: queue.SimpleQueue[ProducerInstance | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        # Keeps the consumer callback alive for the consumer's lifetime (it never gets messages).
        self._noop = MESSAGE_CALLBACK(guarded(E_CONSUME_SUCCESS, "announce consumer", lambda *_: 0))

    # ---- eager: topics known at start -------------------------------------------------------
    def announce_now(self, inst: ProducerInstance, topics: Sequence[str]) -> bool:
        if not topics or not inst.gate.enter_send():
            return False
        try:
            ok = self._via_consumer(inst, topics)
            inst.announced = inst.announced or ok
            return ok
        finally:
            inst.gate.exit_send()

    def _via_consumer(self, inst: ProducerInstance, topics: Sequence[str]) -> bool:
        started, handle = self.heartbeat_through_consumer(inst.group, inst.name, topics)
        if handle is not None:
            inst.defer_destroy_consumer(handle)
        return started

    def heartbeat_through_consumer(
        self, group: str, instance_name: str, topics: Sequence[str]
    ) -> tuple[bool, int | None]:
        """Start and shut down a push consumer on ``instance_name``'s client factory.

        Returns (started, handle); the handle is None when the consumer did not start (it is
        parked, never destroyed: :func:`~txmsg_rocketmq.native.release_push_consumer`).  The
        handle of a started one must be passed to ``DestroyPushConsumer`` only
        after the producer on that instance name has been shut down: a long-polling pull of the
        consumer may still be answered by the broker, and librocketmq then touches the
        consumer's PullAPIWrapper (destroying it right away crashed the process).
        """
        dll = self.native.dll
        # Starts with a letter that is no printf conversion: its retry topic is logged by
        # librocketmq as a format string (see names.py).
        consumer_group = f"TXMSG_ANNOUNCE_{safe_component(group)}"
        topics = [t for t in topics if printf_hazard(t) is None]
        if not topics:
            return False, None
        with NATIVE_LOCK:
            handle = dll.CreatePushConsumer(consumer_group.encode())
            if not handle:
                log.warning("could not create the announce consumer for %s", instance_name)
                return False, None
            started = False
            try:
                dll.SetPushConsumerNameServerAddress(handle, self.name_server.encode())
                dll.SetPushConsumerInstanceName(handle, instance_name.encode())
                dll.SetPushConsumerThreadCount(handle, 1)
                for topic in topics:
                    dll.Subscribe(handle, topic.encode(), NO_MESSAGE_TAG.encode())
                dll.RegisterMessageCallback(handle, self._noop)
                started = start_push_consumer(self.native, handle) == OK
                if not started:
                    log.warning(
                        "announce consumer for %s did not start: %s; its first heartbeat comes "
                        "with librocketmq's 30 s timer",
                        instance_name,
                        self.native.last_error(),
                    )
            finally:
                if started:
                    dll.ShutdownPushConsumer(handle)  # destroyed later, see the docstring
                else:
                    release_push_consumer(self.native, handle, started=False, keep=self._noop)
            return started, (int(handle) if started else None)

    # ---- lazy: after the first send to a topic ----------------------------------------------
    def announce_later(self, inst: ProducerInstance) -> None:
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="txmsg-rocketmq-announce", daemon=True
                )
                self._thread.start()
        self._queue.put(inst)

    def _run(self) -> None:
        while True:
            inst = self._queue.get()
            if inst is None:
                return
            if not inst.gate.enter_send():
                continue  # closing: nothing to announce any more
            try:
                inst.announced = self._via_producer(inst) or inst.announced
            except BaseException:  # noqa: BLE001 - a daemon thread must not die silently
                log.exception("announcing %s failed", inst.name)
            finally:
                inst.gate.exit_send()

    def _via_producer(self, inst: ProducerInstance) -> bool:
        dll = self.native.dll
        with NATIVE_LOCK:
            handle = dll.CreateProducer(ANNOUNCE_PRODUCER_GROUP.encode())
            if not handle:
                return False
            try:
                dll.SetProducerNameServerAddress(handle, self.name_server.encode())
                dll.SetProducerInstanceName(handle, inst.name.encode())
                started = int(dll.StartProducer(handle)) == OK
                dll.ShutdownProducer(handle)
                return started
            finally:
                dll.DestroyProducer(handle)

    def forget(self, instances: Sequence[ProducerInstance], deadline: float) -> None:
        """Nothing to do: pending announcements pass the gate, which ``close`` drains."""

    def stop(self) -> None:
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                self._queue.put(None)
                self._thread.join(timeout=5.0)
            self._thread = None
