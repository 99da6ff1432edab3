"""Making a producer group known to every broker at once instead of after up to 30 s.

Why: a broker sends check-backs only to channels it learned from a ``HEART_BEAT`` that listed the
group (Apache RocketMQ 4.9.8 ``ClientManageProcessor.heartBeat``; sends teach it nothing).
librocketmq heartbeats 10 ms after ``start()`` - but its broker table is still empty then (it fills
it from topic routes), so that heartbeat goes nowhere - and then every 30 s
(``MQClientFactory::startScheduledTask``).  Until then every check-back of the group fails on the
broker with ``Check transaction failed, channel table is empty`` and still counts towards
``transactionCheckMax``: with a short check interval the half messages are discarded.  A producer
that never sends never learns a route at all, so after a restart it would never get the check-backs
of its predecessor's pending transactions.

The C API has no "send heartbeat" call, but two client starts heartbeat immediately, and a client
created with the same instance name shares the producer's ``MQClientFactory`` (the factory is keyed
by ``ip@pid#instanceName``), so that heartbeat carries our producer group too:

* at start, ``announce_now(instance, topics)`` - a short-lived push consumer on the same instance
  name, subscribed with a tag no message carries to the topics whose route lists the brokers the
  group will use: each declared topic that has a route, and ``TBW102`` for one that does not yet
  (its first send goes through TBW102's route and creates it on those brokers, see
  :mod:`.routes`).  Its start fetches those routes (filling the broker table) and calls
  ``sendHeartbeatToAllBroker``; it is shut down right away (the shared factory stays up because our
  producer is still registered in it) and destroyed only after the instance itself is shut down.
  On a real cluster this leaves, per producer group, a subscription group
  ``TXMSG_ANNOUNCE_<group>`` and a topic ``%RETRY%TXMSG_ANNOUNCE_<group>`` (1 queue) when the broker
  has ``autoCreateSubscriptionGroup=true`` (the default), and possibly consumer offsets of that
  group; docs/backend-design.md ("Being known to the broker") gives the mqadmin commands that
  remove them.  With ``autoCreateSubscriptionGroup=false`` nothing is created and the heartbeat still
  registers the producer group (4.9.8 registers producers whatever happens to the consumer part).
* after the first send of each topic by an instance, ``announce_later(instance)`` - a plain
  producer of group ``TXMSG_ANNOUNCE`` on the same instance name is started (start heartbeats to
  all brokers the factory knows, which now include the broker the send went to) and shut down
  (unregistering only ``TXMSG_ANNOUNCE``).  Producer groups are not persisted by a broker: this
  leaves nothing behind.  Runs on a background thread so the send is not delayed.
* when a broker joins later: a watcher thread asks the name server every ``watch_interval``
  seconds for the routes of the announced topics (TBW102's for those without one); when a route
  gains a master address, every instance using that topic is announced again as at start (the
  consumer's start re-fetches the routes, so the factory learns the new broker at once).

All go through the instance's gate as a "send", so ``close()`` waits for them.
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
from .routes import DEFAULT_TOPIC, RouteQueryError, query_route

if TYPE_CHECKING:
    from .pool import ProducerInstance

log = logging.getLogger("txmsg.rocketmq")

ANNOUNCE_PRODUCER_GROUP = "TXMSG_ANNOUNCE"
NO_MESSAGE_TAG = "TXMSG_ANNOUNCE_NO_MESSAGES"
WATCH_INTERVAL_S = 10.0
"""How often the watcher asks the name server whether a topic's route gained a broker."""


class Announcer:
    """Sends first heartbeats for producer instances (see module docstring)."""

    def __init__(
        self,
        native: Native,
        name_server: str,
        *,
        watch_interval: float = WATCH_INTERVAL_S,
        credentials: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        self.native = native
        self.name_server = name_server
        #: access key, secret key, channel (a broker with ACL): the announcing clients sign too
        self.credentials = credentials
        self.watch_interval = watch_interval
        self._queue: queue.SimpleQueue[ProducerInstance | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        # Keeps the consumer callback alive for the consumer's lifetime (it never gets messages).
        self._noop = MESSAGE_CALLBACK(guarded(E_CONSUME_SUCCESS, "announce consumer", lambda *_: 0))
        # watcher: announced instances with their topics, and the masters last seen per topic
        self._watched: list[tuple[ProducerInstance, tuple[str, ...]]] = []
        self._masters: dict[str, frozenset[str]] = {}
        self._watch_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ---- eager: topics known at start -------------------------------------------------------
    def announce_now(self, inst: ProducerInstance, topics: Sequence[str]) -> bool:
        if not topics or not inst.gate.enter_send():
            return False
        try:
            ok = self._via_consumer(inst, self.route_topics(topics))
            inst.announced = inst.announced or ok
        finally:
            inst.gate.exit_send()
        self._watch(inst, topics)
        return ok

    def route_topics(self, topics: Sequence[str]) -> list[str]:
        """The topics whose routes list the brokers ``topics`` are (or will be) on.

        A declared topic with a route stands for itself; one without a route yet is replaced by
        ``TBW102``: with ``autoCreateTopicEnable`` its first send goes through TBW102's route and
        creates the topic on those brokers.  If the name server cannot be asked from here, the
        declared topics and TBW102 are all subscribed (routes that do not exist are skipped by
        librocketmq).
        """
        chosen: list[str] = []
        try:
            for topic in topics:
                if self._masters_of(topic):
                    chosen.append(topic)
                elif self._masters_of(DEFAULT_TOPIC):
                    chosen.append(DEFAULT_TOPIC)
                else:
                    log.warning(
                        "topic %s has no route and the cluster has no %s route "
                        "(autoCreateTopicEnable=false?): sends to it will fail with 'No route info'; "
                        "create it first, e.g. mqadmin updateTopic -n %s -c <cluster> -t %s",
                        topic,
                        DEFAULT_TOPIC,
                        self.name_server,
                        topic,
                    )
        except RouteQueryError as exc:
            log.warning(
                "cannot ask the name server for routes (%s); announcing through all topics", exc
            )
            return [*dict.fromkeys([*topics, DEFAULT_TOPIC])]
        return [*dict.fromkeys(chosen)]

    def _masters_of(self, topic: str) -> frozenset[str]:
        """Masters of ``topic``'s own route (raises RouteQueryError), remembered for the watcher."""
        masters = query_route(self.name_server, topic).masters
        with self._watch_lock:
            self._masters[topic] = masters
        return masters

    # ---- a broker joins later -------------------------------------------------------------------
    def _watch(self, inst: ProducerInstance, topics: Sequence[str]) -> None:
        with self._watch_lock:
            self._watched.append((inst, tuple(topics)))
            if self._watcher is None or not self._watcher.is_alive():
                self._stop.clear()
                self._watcher = threading.Thread(
                    target=self._watch_loop, name="txmsg-rocketmq-routes", daemon=True
                )
                self._watcher.start()

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.watch_interval):
            try:
                self.check_routes()
            except BaseException:  # a daemon thread must not die silently
                log.exception("watching the routes of announced topics failed")

    def check_routes(self) -> int:
        """Announce again every instance whose topics gained a master since the last look.

        Returns the number of instances announced.  A topic without a route is watched through
        TBW102's route (where its first send will create it).
        """
        with self._watch_lock:
            self._watched = [(i, t) for i, t in self._watched if not i.shut_down]
            watched = list(self._watched)
            before = dict(self._masters)
        topics = {t for _, ts in watched for t in ts}
        grown: set[str] = set()
        try:
            for topic in sorted(topics):
                default = before.get(DEFAULT_TOPIC, frozenset())
                own = self._masters_of(topic)
                # a topic just created by its first send had TBW102's brokers before: no news
                if own - (before.get(topic) or default) or (
                    not own and self._masters_of(DEFAULT_TOPIC) - default
                ):
                    grown.add(topic)
        except RouteQueryError as exc:
            log.debug("route watch skipped: %s", exc)
            return 0
        announced = 0
        for inst, inst_topics in watched:
            if grown & set(inst_topics) and inst.gate.enter_send():
                try:
                    log.info(
                        "a broker joined the route of %s: announcing %s again",
                        sorted(grown),
                        inst.name,
                    )
                    announced += self._via_consumer(inst, self.route_topics(inst_topics))
                finally:
                    inst.gate.exit_send()
        return announced

    def _via_consumer(self, inst: ProducerInstance, topics: Sequence[str]) -> bool:
        if not topics:
            return False
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
                if self.credentials is not None:
                    dll.SetPushConsumerSessionCredentials(handle, *self.credentials)
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
            except BaseException:  # a daemon thread must not die silently
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
                if self.credentials is not None:
                    dll.SetProducerSessionCredentials(handle, *self.credentials)
                started = int(dll.StartProducer(handle)) == OK
                dll.ShutdownProducer(handle)
                return started
            finally:
                dll.DestroyProducer(handle)

    def forget(self, instances: Sequence[ProducerInstance], deadline: float) -> None:
        """Nothing to do: pending announcements pass the gate, which ``close`` drains."""

    def stop(self) -> None:
        self._stop.set()
        with self._watch_lock:
            watcher, self._watcher = self._watcher, None
            self._watched.clear()
        if watcher is not None and watcher.is_alive():
            watcher.join(timeout=5.0)
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                self._queue.put(None)
                self._thread.join(timeout=5.0)
            self._thread = None
