"""Client sessions of the gRPC endpoint: settings, telemetry streams, and gRPC clients as channels.

Why a channel class: the remoting broker picks check-back targets from ``broker.clients`` (producer
group -> channels, round-robin, as Java's ``ProducerManager``). A 5.x client registers there too - one
:class:`GrpcChannel` per client id, in the group named like each topic it publishes (the proxy uses
the topic as producer group) - so the shared check loop round-robins over remoting connections and gRPC
clients alike, and a check-back for a gRPC client becomes a ``RecoverOrphanedTransactionCommand``
pushed down that client's telemetry stream.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client_service import register_producer
from ..message_codec import PROPERTY_REAL_TOPIC, StoredMessage
from ..transport import Connection
from .convert import to_proto
from .stubs import pb, svc

if TYPE_CHECKING:
    from ..broker import Broker

CHECK_SEND_THREAD = "Transaction-msg-check-thread"
_channel_ids = itertools.count(0x5A000001, 0x2F1)


@dataclass
class ClientSession:
    """One 5.x client (key: the ``x-mq-client-id`` header)."""

    client_id: str
    peer: str
    language: str = "PYTHON"
    settings: Any = None
    #: commands for the client's current telemetry stream (None: no stream open)
    outbox: asyncio.Queue[Any] | None = None
    channel: GrpcChannel | None = None
    groups: set[str] = field(default_factory=set)


class GrpcChannel(Connection):
    """A 5.x client as a broker "channel" (``GrpcClientChannel``): what ``broker.clients`` holds.

    Not a socket: ``closed`` follows the client's telemetry stream, and the one broker -> client
    request it supports is the transaction check-back (:meth:`push_transaction_check`).
    """

    def __init__(self, session: ClientSession, sessions: Sessions) -> None:
        # deliberately not Connection.__init__: there is no transport
        self.session = session
        self.sessions = sessions
        self.id = next(_channel_ids) & 0xFFFFFFFF
        self.remote_addr = session.peer
        self.local_addr = sessions.local_addr
        self.client_id = session.client_id
        self.language = session.language
        self.version = 0
        self.closed = False
        self.attributes: dict[str, Any] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.close_callbacks = []

    def __repr__(self) -> str:
        return f"GrpcChannel({self.remote_addr}, client_id={self.client_id!r})"

    def describe(self) -> str:
        state = "!" if self.closed else "-"
        return f"[id: 0x{self.id:08x}, L:/{self.local_addr} {state} R:/{self.remote_addr}, grpc clientId={self.client_id}]"

    def send(self, cmd: Any) -> bool:
        return False  # no remoting frames to a gRPC client

    def send_oneway(
        self, code: int, ext_fields: dict[str, Any] | None = None, body: bytes = b""
    ) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for cb in list(self.close_callbacks):
            cb(self)

    def push_transaction_check(self, msg: StoredMessage) -> bool:
        """Check-back for the half message copy ``msg`` (called by the shared check loop).

        Logs the 5.x INFO line per check (``Check transaction. real_topic=...,uniqKey=...``) and writes
        ``RecoverOrphanedTransactionCommand{message, transaction_id}`` to the telemetry stream.
        """
        return self.sessions.push_check(self, msg)


class Sessions:
    """All client sessions of one endpoint; used only on the broker's event loop."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.by_id: dict[str, ClientSession] = {}
        self.local_addr = ""
        #: (producer group, transaction id) -> (half queue offset, commit log offset), like the
        #: proxy's TransactionDataManager: filled on send and on every check-back
        self.transactions: dict[tuple[str, str], tuple[int, int]] = {}

    def get(self, client_id: str, peer: str, language: str = "PYTHON") -> ClientSession:
        session = self.by_id.get(client_id)
        if session is None:
            session = self.by_id[client_id] = ClientSession(client_id, peer, language or "PYTHON")
        return session

    # -- settings / registration -----------------------------------------------------------------
    def apply_settings(self, session: ClientSession, settings: Any) -> Any:
        """Store the client's settings, register it as a producer of its topics; the merged answer."""
        session.settings = settings
        if settings.WhichOneof("pub_sub") == "publishing":
            for topic in settings.publishing.topics:
                self.register_producer(session, topic.name)
        return self.merged_settings(settings)

    def merged_settings(self, settings: Any) -> Any:
        """``GrpcClientSettingsManager.mergeProducerData``/``mergeMetric`` with the broker's limits."""
        merged = pb.Settings()
        merged.CopyFrom(settings)
        if settings.WhichOneof("pub_sub") == "publishing":
            policy = merged.backoff_policy
            policy.max_attempts = 3
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromMilliseconds(1000)
            policy.exponential_backoff.multiplier = 2.0
            merged.publishing.validate_message_type = self.broker.config.enforce_topic_types
            merged.publishing.max_body_size = self.broker.config.max_message_size
        merged.metric.on = False
        return merged

    def register_producer(self, session: ClientSession, group: str) -> None:
        if not group:
            return
        channel = session.channel
        if channel is None or channel.closed:
            channel = session.channel = GrpcChannel(session, self)
        session.groups.add(group)
        register_producer(self.broker, group, channel, "ClientManageThread_1", session.client_id)

    def heartbeat(self, session: ClientSession) -> bool:
        """Refresh the client's registrations; False if it never sent settings."""
        if session.settings is None:
            return False
        if session.settings.WhichOneof("pub_sub") == "publishing":
            for topic in session.settings.publishing.topics:
                self.register_producer(session, topic.name)
        return True

    def terminate(self, session: ClientSession) -> bool:
        """NotifyClientTermination: forget the client everywhere; False if it had no settings."""
        had_settings = session.settings is not None
        self.drop(session)
        self.by_id.pop(session.client_id, None)
        return had_settings

    def drop(self, session: ClientSession) -> None:
        """Unregister the client's channel from every group (stream gone or client terminated)."""
        channel = session.channel
        if channel is None:
            return
        for group in list(session.groups):
            if self.broker.clients.unregister_producer(group, channel):
                self.broker.logs.broker.info(
                    "ClientManageThread_1",
                    f"unregister a producer[{group}] from producerTable {channel.describe()}",
                )
        session.groups.clear()
        channel.close()
        session.channel = None

    def stream_closed(self, session: ClientSession, outbox: asyncio.Queue[Any]) -> None:
        if session.outbox is outbox:
            session.outbox = None
            self.drop(session)

    # -- transaction check-backs -----------------------------------------------------------------
    def push_check(self, channel: GrpcChannel, msg: StoredMessage) -> bool:
        session = channel.session
        real_topic = msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic)
        uniq = msg.uniq_key
        self.broker.logs.transaction.info(
            CHECK_SEND_THREAD,
            f"Check transaction. real_topic={real_topic},uniqKey={uniq},offset={msg.queue_offset},"
            f"commitLogOffset={msg.commit_log_offset}",
        )
        outbox = session.outbox
        if outbox is None or channel.closed:
            self.broker.logs.broker.error(
                CHECK_SEND_THREAD,
                f"Check transaction failed because invoke producer exception. group={real_topic}, "
                f"msgId={msg.msg_id}, error=telemetry stream of gRPC client {session.client_id} is closed",
            )
            return False
        group = msg.properties.get("PGROUP", real_topic)
        self.transactions[(group, uniq)] = (msg.queue_offset, msg.commit_log_offset)
        command = svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=to_proto(msg, topic=real_topic), transaction_id=uniq
            )
        )
        outbox.put_nowait(command)
        return True
