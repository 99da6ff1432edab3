"""The 5.x client's ``Producer``, with check-backs handed to txmsg instead of its one-thread pool.

Why a subclass that takes over ``on_recover_orphaned_transaction_command`` (and not the other way
out, swapping the client's private ``ThreadPoolExecutor(max_workers=1)`` for a bigger one):

* The client's own path runs ``checker.check()`` in that executor and never reads the future, so a
  checker that raises is lost without a log line or an answer; and its pool is a name-mangled
  attribute (``_Producer__transaction_check_executor``) that ``shutdown()`` sets to None - replacing
  it relies on a private name *and* keeps the silent-drop path.
* ``on_recover_orphaned_transaction_command(endpoints, message, transaction_id)`` is the client's
  public hook: its telemetry stream reader calls it for every ``RecoverOrphanedTransactionCommand``
  (on the client's asyncio I/O thread, which must not block).  Overriding it gives the command
  to txmsg at once; txmsg starts the check on the listener's executor without waiting for it
  (``CheckDispatcher.submit``, see :mod:`.sender`), answers with ``EndTransaction`` itself from
  the check's done-callback and logs every failure.  No thread of this backend waits for a check.

The checker passed to the base class only exists because ``begin_transaction()`` refuses a
producer without one; it is never called.

Also here: per-send ``orphaned_transaction_recovery_duration`` (txmsg's ``check_immunity_seconds``),
which the 5.x client cannot set: the send request is amended on its way to the RPC layer, in the
sending thread (the client's synchronous send builds and sends its request in the caller's thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ._client import EndTransactionRequest, Producer, TransactionChecker, TransactionSource

log = logging.getLogger("txmsg.rocketmq5")

CheckCommand = Callable[[Any, Any, str], None]
"""``(endpoints, protobuf message, transaction_id)``: must return at once (I/O thread): it
starts the check and leaves the answer to the check's completion."""


def shut_down(client: Any, owner: str) -> None:
    """``client.shutdown()``, logging a failure instead of raising it.

    Why: every close() of this backend (producers, plain senders, consumers) must finish even when
    the 5.x client fails to shut down, so the rest of the app still closes; ``owner`` names the
    group in the log line (``"producer group G"``, ``"consumer group G"``)."""
    try:
        client.shutdown()
    except Exception:  # closing must finish
        log.exception("%s: the 5.x client failed to shut down", owner)


class _NeverCalled(TransactionChecker):  # type: ignore[misc]
    def check(self, message: Any) -> Any:  # pragma: no cover - the override bypasses it
        raise AssertionError("txmsg answers check-backs itself; the client's checker is unused")


class CheckingProducer(Producer):  # type: ignore[misc]
    """A transactional 5.x ``Producer`` whose check-backs go to ``on_check``."""

    def __init__(
        self,
        configuration: Any,
        topics: tuple[str, ...],
        *,
        on_check: CheckCommand,
        tls: bool = False,
    ) -> None:
        super().__init__(configuration, topics, _NeverCalled(), tls)
        self._on_check = on_check
        self._immunity = threading.local()
        rpc = self.rpc_client
        send_async = rpc.send_message_async

        def send_with_immunity(endpoints: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
            seconds = getattr(self._immunity, "seconds", None)
            if seconds:
                for message in req.messages:
                    message.system_properties.orphaned_transaction_recovery_duration.seconds = (
                        seconds
                    )
            return send_async(endpoints, req, *args, **kwargs)

        rpc.send_message_async = send_with_immunity

    def on_recover_orphaned_transaction_command(
        self, endpoints: Any, msg: Any, transaction_id: str
    ) -> None:
        """Called by the telemetry stream reader (I/O thread): hand over, never block or raise."""
        try:
            self._on_check(endpoints, msg, transaction_id)
        except BaseException:  # this runs on the client's I/O loop
            log.error(
                "%s: could not take check-back of transaction %s; the broker will check again",
                self,
                transaction_id,
                exc_info=True,
            )

    def send_half(self, message: Any, transaction: Any, immunity_seconds: int | None) -> Any:
        """``send(message, transaction)`` with ``orphaned_transaction_recovery_duration`` set."""
        self._immunity.seconds = immunity_seconds
        try:
            return self.send(message, transaction)
        finally:
            self._immunity.seconds = None

    def end_checked(
        self, endpoints: Any, topic: str, message_id: str, transaction_id: str, resolution: int
    ) -> Any:
        """Answer a check-back (``EndTransaction`` with ``SOURCE_SERVER_CHECK``); returns the RPC's
        ``concurrent.futures.Future`` at once.

        Not waited for in the check thread: one group's checks then cost ``check_local`` alone, not
        ``check_local`` plus a round trip (with one thread, 200 checks of 100 ms ran at 8/s instead
        of 10/s while each thread waited for its reply)."""
        req = EndTransactionRequest()
        req.topic.name = topic
        req.topic.resource_namespace = self.client_configuration.namespace
        req.message_id = message_id
        req.transaction_id = transaction_id
        req.resolution = resolution
        req.source = TransactionSource.SOURCE_SERVER_CHECK
        return self.rpc_client.end_transaction_async(
            endpoints, req, metadata=self.sign(), timeout=self.client_configuration.request_timeout
        )

    def announce_topics(self) -> None:
        """Send the producer's settings (its publishing topics) to every known endpoint now.

        Why: the proxy routes check-backs of a topic only to clients whose settings name it, and
        the client resends settings every 300 s or for new endpoints only; a first send to a
        topic not given at construction would otherwise get no check-backs for minutes.
        """
        manager = getattr(self, "_Client__telemetry_manager", None)
        if manager is None:  # a client version without it: say so, do not break sends
            log.warning(
                "%s: cannot resend settings (client internals changed); check-backs of topics "
                "not declared on the listener may arrive only after the client's 300 s sync. "
                "Declare every topic: @transactional_listener(topics=[...])",
                self,
            )
            return
        for endpoints in list(self.route_manager.get_all_endpoints().values()):
            manager.setting_write(endpoints)
