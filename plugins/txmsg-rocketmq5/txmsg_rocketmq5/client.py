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

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ._client import (
    EndTransactionRequest,
    IllegalArgumentException,
    IllegalStateException,
    Message,
    Producer,
    TransactionChecker,
    TransactionSource,
)
from .routes import fetch_routes_on_their_thread

log = logging.getLogger("txmsg.rocketmq5")

_SEND_STEPS = (
    "wrap_sending_message",
    "select_send_queue",
    "send_req",
    "handle_send_result",
    "check_send_retry_condition",
    "send",
)
"""The client's name-mangled steps of a send that :meth:`CheckingProducer.send_half_async` runs."""

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


def _quietly(call: Callable[..., Any], *args: Any) -> None:
    """``call(*args)`` for the client's own bookkeeping (its metrics), on its I/O thread: a
    failure there is logged, never raised into the thread or in the way of the answer."""
    try:
        call(*args)
    except Exception:
        log.warning("the 5.x client's send metrics failed", exc_info=True)


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
        fetch_routes_on_their_thread(self)
        self._on_check = on_check
        self._immunity = threading.local()
        self._immunity_by_id: dict[str, int] = {}
        rpc = self.rpc_client
        send_async = rpc.send_message_async

        def send_with_immunity(endpoints: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
            seconds = getattr(self._immunity, "seconds", None)
            if not seconds and self._immunity_by_id:  # a split send (send_half_async), any thread
                seconds = self._immunity_by_id.get(req.messages[0].system_properties.message_id)
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

    @functools.cached_property
    def splits_sends(self) -> bool:
        """True when :meth:`send_half_async` can work: it uses the client's own steps of a send
        (name-mangled methods of ``Producer``), which a client release may rename."""
        return all(hasattr(self, f"_Producer__{name}") for name in _SEND_STEPS)

    def send_half_async(
        self, message: Any, transaction: Any, immunity_seconds: int | None
    ) -> Future[Any]:
        """``send(message, transaction)`` without blocking: the future ends with the send
        receipt (or the send's error, after the client's own retries).

        The client's synchronous ``send`` runs these steps of its own, then waits; its
        ``send_async`` runs them for non-transactional messages only and hands every answer to
        its callback pool first.  Here the first attempt's answer is taken on the client's I/O
        thread (a hand-over less per send: ~10 % of an awaited send's CPU); a failed first
        attempt goes on with the client's own synchronous send from attempt 2, on a thread of
        its own (:meth:`_retry_half`).  The check immunity is looked up by message id, as those
        retries run on another thread.

        Choosing the queue reads the topic's route: cached for a topic the producer was created
        with or has sent to, otherwise fetched here, waiting up to the request timeout (the
        caller keeps that off an event loop)."""
        if not self.is_running:
            raise IllegalStateException("producer is not running now.")
        self._Producer__wrap_sending_message(message, True)
        queue = self._Producer__select_send_queue(message)
        validate = getattr(self, "_Producer__validate_message_type", True)
        if validate and message.message_type not in queue.accept_message_types:
            raise IllegalArgumentException(
                f"current message type not match with queue accept message types, topic:"
                f"{message.topic}, message_type:{Message.message_type_desc(message.message_type)},"
                f" queue access type:{queue.accept_message_types_desc()}"
            )
        transaction.add_half_message(message)
        message_id = message.message_id
        result: Future[Any] = Future()
        if immunity_seconds:
            self._immunity_by_id[message_id] = immunity_seconds
            result.add_done_callback(lambda _: self._immunity_by_id.pop(message_id, None))
        try:
            request = self._Producer__send_req(message)
            metric = self.client_metrics.send_before(message.topic)
            answer: Future[Any] = self.rpc_client.send_message_async(
                queue.endpoints,
                request,
                self.sign(),
                timeout=self.client_configuration.request_timeout,
            )
        except BaseException:
            self._immunity_by_id.pop(message_id, None)
            raise

        def answered(done: Future[Any]) -> None:  # the client's I/O thread: must not block
            try:
                receipt = self._Producer__handle_send_result(done, queue)
            except Exception as exc:  # noqa: BLE001 - retried, or handed to the caller
                _quietly(self.client_metrics.send_after, metric, False)
                self._retry_half(message, queue, exc, result)
                return
            _quietly(self.client_metrics.send_after, metric, True)
            result.set_result(receipt)

        answer.add_done_callback(answered)
        return result

    def _retry_half(
        self, message: Any, queue: Any, failure: Exception, result: Future[Any]
    ) -> None:
        """The client's retry rule for a failed first attempt: attempts 2.. are the client's own
        synchronous send (its retries included), on a short-lived thread of their own, as they
        would run in the caller's thread of a synchronous send.  Never on the I/O thread, which
        this is called on: choosing a queue there may wait for a route the I/O thread itself
        must fetch.  Whatever happens, ``result`` ends."""
        try:
            ended = self._Producer__check_send_retry_condition(message, queue, 2, failure)
        except Exception as exc:  # noqa: BLE001 - the caller gets it
            result.set_exception(exc)
            return
        if ended is not None:  # no attempt left, or the broker is throttling
            result.set_exception(failure)
            return

        def retry() -> None:
            try:
                receipt = self._Producer__send(
                    message, self._Producer__select_send_queue(message), 2
                )
            except BaseException as exc:  # noqa: BLE001 - the caller gets it
                result.set_exception(exc)
                return
            result.set_result(receipt)

        try:
            threading.Thread(target=retry, name="txmsg-rocketmq5-retry", daemon=True).start()
        except BaseException as exc:  # noqa: BLE001 - no thread (interpreter exiting): say so
            result.set_exception(exc)

    def end_async(
        self, endpoints: Any, topic: str, message_id: str, transaction_id: str, resolution: int
    ) -> Future[Any]:
        """Commit or roll back a transaction this client sent (``EndTransaction`` with
        ``SOURCE_CLIENT``, what ``Transaction.commit()`` sends); returns the RPC's future."""
        return self._end(
            endpoints,
            topic,
            message_id,
            transaction_id,
            resolution,
            TransactionSource.SOURCE_CLIENT,
        )

    def end_checked(
        self, endpoints: Any, topic: str, message_id: str, transaction_id: str, resolution: int
    ) -> Any:
        """Answer a check-back (``EndTransaction`` with ``SOURCE_SERVER_CHECK``); returns the RPC's
        ``concurrent.futures.Future`` at once.

        Not waited for in the check thread: one group's checks then cost ``check_local`` alone, not
        ``check_local`` plus a round trip (with one thread, 200 checks of 100 ms ran at 8/s instead
        of 10/s while each thread waited for its reply)."""
        return self._end(
            endpoints,
            topic,
            message_id,
            transaction_id,
            resolution,
            TransactionSource.SOURCE_SERVER_CHECK,
        )

    def _end(
        self,
        endpoints: Any,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: int,
        source: int,
    ) -> Future[Any]:
        req = EndTransactionRequest()
        req.topic.name = topic
        req.topic.resource_namespace = self.client_configuration.namespace
        req.message_id = message_id
        req.transaction_id = transaction_id
        req.resolution = resolution
        req.source = source
        future: Future[Any] = self.rpc_client.end_transaction_async(
            endpoints, req, metadata=self.sign(), timeout=self.client_configuration.request_timeout
        )
        return future

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
