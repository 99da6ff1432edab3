"""``TransactionalProducer``: send a message and run the local transaction, for one group.

The send follows RocketMQ's protocol: the backend sends a half message, then calls our local
executor **in the sending thread** with the message as the broker stored it (so the transaction
key is known), then ends the transaction with the state ``execute_local`` decided.  ``arg``
reaches ``execute_local`` through a closure: the real client's ``user_args`` can only carry
ints and strings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from txmsg.backend import Backend, TransactionalSender
from txmsg.convert import to_body
from txmsg.defaults import CHECK_WAIT_TIMEOUT
from txmsg.dispatch import CheckDispatcher, DispatchStats
from txmsg.errors import (
    InvalidMessageError,
    ProducerClosedError,
    RejectedError,
    SendError,
    TxMsgError,
)
from txmsg.executor import ExecutorConfig, ExecutorStats, TxExecutor
from txmsg.listener import ListenerSpec
from txmsg.message import Message, OutgoingMessage, TransactionSendResult
from txmsg.names import NameRule, check_name, rocketmq_rule
from txmsg.safety import run_execute_local
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.producer")


@dataclass(frozen=True)
class ProducerStats:
    """Figures of one producer group."""

    group: str
    sent: int
    committed: int
    rolled_back: int
    unknown: int
    failed: int
    executor: ExecutorStats
    checks: DispatchStats


def _keys_text(keys: str | Sequence[str] | None) -> str | None:
    if keys is None or isinstance(keys, str):
        return keys
    return " ".join(str(k) for k in keys)  # RocketMQ's KEY_SEPARATOR


class TransactionalProducer:
    """Sends transactional messages for one producer group.

    Usually created by :class:`txmsg.TxMsg` (one per registered listener) or by
    :meth:`create` when used without the application object.
    """

    name_rules: tuple[NameRule, ...] = (rocketmq_rule,)
    """Rules every send's topic must pass (RocketMQ's, plus the backend's when made by an app)."""

    def __init__(
        self,
        sender: TransactionalSender,
        listener: Any,
        spec: ListenerSpec,
        executor: TxExecutor,
        dispatcher: CheckDispatcher,
    ) -> None:
        self.sender = sender
        self.listener = listener
        self.spec = spec
        self.executor = executor
        self.dispatcher = dispatcher
        self._lock = threading.Lock()
        self._closed = False
        self._counts = {"sent": 0, "failed": 0} | {s.name: 0 for s in LocalTransactionState}

    @property
    def group(self) -> str:
        """The producer group (one listener per group)."""
        return self.spec.group

    @classmethod
    def create(
        cls,
        backend: Backend,
        spec: ListenerSpec,
        listener: Any,
        executor_config: ExecutorConfig | None = None,
        *,
        check_wait_timeout: float = CHECK_WAIT_TIMEOUT,
        name_rules: tuple[NameRule, ...] = (rocketmq_rule,),
    ) -> TransactionalProducer:
        """Build the executor and check dispatcher for ``spec`` and start a sender on ``backend``.

        ``name_rules`` check the topic of every send (the app passes its backend's rules)."""
        executor = TxExecutor(executor_config or spec.executor, name=f"txmsg-{spec.group}")
        dispatcher = CheckDispatcher(listener, spec, executor, wait_timeout=check_wait_timeout)
        try:
            sender = backend.create_transactional_sender(
                spec.group,
                dispatcher.handle,
                check_concurrency=dispatcher.check_concurrency,
                topics=spec.topics,
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        producer = cls(sender, listener, spec, executor, dispatcher)
        producer.name_rules = name_rules
        return producer

    # ---- sending --------------------------------------------------------------------------------
    def send_in_transaction(
        self,
        topic: str,
        payload: Any,
        *,
        arg: Any = None,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
        check_immunity_seconds: int | None = None,
    ) -> TransactionSendResult:
        """Send ``payload`` to ``topic`` as a half message, run ``execute_local(message, arg)``
        in this thread, and end the transaction with its answer.

        ``result.local_state`` is the answer after exception mapping (None when the local
        transaction did not run because the half send failed).

        Raises:
            InvalidNameError: the topic name is refused by RocketMQ or the backend.
            InvalidMessageError: the payload cannot be converted (see :mod:`txmsg.convert`) or
                ``check_immunity_seconds`` is invalid.
            ProducerClosedError: after :meth:`close`.
            SendError: the broker or the backend refused the half message.
        """
        if self._closed:
            raise ProducerClosedError(
                f"producer group {self.group!r} is closed; sends must happen before TxMsg.close()"
            )
        message = self._outgoing(topic, payload, keys, tags, properties, check_immunity_seconds)
        decided: list[LocalTransactionState] = []
        listener, spec = self.listener, self.spec

        def local_executor(half: Message) -> LocalTransactionState:
            try:
                state = run_execute_local(listener, half, arg, spec)
            except BaseException:  # noqa: BLE001 - run_execute_local never raises; be sure
                state = spec.on_exception
            decided.append(state)
            return state

        try:
            message_id, transaction_key, status, offset = self.sender.send_in_transaction(
                message, local_executor
            )
        except TxMsgError:
            self._count("failed")
            raise
        except Exception as exc:
            self._count("failed")
            raise SendError(
                f"group={self.group} topic={topic}: sending the half message failed: {exc}; "
                "check that the name server and broker are reachable (`txmsg doctor`)"
            ) from exc
        state = decided[-1] if decided else None
        self._count("sent")
        if state is not None:
            self._count(state.name)
        return TransactionSendResult(
            message_id=message_id,
            transaction_key=transaction_key,
            local_state=state,
            send_status=status,
            offset=offset,
        )

    def send_in_transaction_async(
        self,
        topic: str,
        payload: Any,
        *,
        arg: Any = None,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
        check_immunity_seconds: int | None = None,
    ) -> Future[TransactionSendResult]:
        """:meth:`send_in_transaction` on the listener's executor; returns its future.

        When every executor thread is busy and ``queue_capacity`` sends wait, the executor's
        rejection policy applies: ``caller_runs`` (default) sends in this thread and returns a
        finished future; ``abort`` raises :class:`RejectedError` (nothing was sent).

        Raises:
            RejectedError: ``rejection='abort'`` and the executor is full.
            ProducerClosedError: after :meth:`close`.
        """
        if self._closed:
            raise ProducerClosedError(f"producer group {self.group!r} is closed")
        kwargs: dict[str, Any] = {
            "arg": arg,
            "keys": keys,
            "tags": tags,
            "properties": properties,
            "check_immunity_seconds": check_immunity_seconds,
        }
        try:
            future: Future[TransactionSendResult] = self.executor.submit(
                self.send_in_transaction, topic, payload, **kwargs
            )
        except RejectedError as exc:
            if self.executor.is_shutdown:  # closed between the check above and submit()
                raise ProducerClosedError(f"producer group {self.group!r} is closed") from exc
            raise
        return future

    def _outgoing(
        self,
        topic: str,
        payload: Any,
        keys: str | Sequence[str] | None,
        tags: str | None,
        properties: Mapping[str, Any] | None,
        check_immunity_seconds: int | None,
    ) -> OutgoingMessage:
        check_name("topic", topic, owner=f"group {self.group}: send", rules=self.name_rules)
        if check_immunity_seconds is not None and (
            not isinstance(check_immunity_seconds, int) or check_immunity_seconds < 1
        ):
            raise InvalidMessageError(
                f"check_immunity_seconds must be a positive int (seconds before the first "
                f"check-back), got {check_immunity_seconds!r}"
            )
        props = {str(k): str(v) for k, v in (properties or {}).items()}
        return OutgoingMessage(
            topic=topic,
            body=to_body(payload),
            tags=tags,
            keys=_keys_text(keys),
            properties=props,
            check_immunity_seconds=check_immunity_seconds,
        )

    # ---- figures and lifecycle ------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def stats(self) -> ProducerStats:
        """Send outcomes, executor figures and check-back figures of this group."""
        with self._lock:
            c = dict(self._counts)
        return ProducerStats(
            group=self.group,
            sent=c["sent"],
            committed=c["COMMIT"],
            rolled_back=c["ROLLBACK"],
            unknown=c["UNKNOW"],
            failed=c["failed"],
            executor=self.executor.stats(),
            checks=self.dispatcher.stats(),
        )

    @property
    def closed(self) -> bool:
        """True after close(); sends then raise ProducerClosedError."""
        return self._closed

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop sending: close the backend's sender (it waits for in-flight callbacks, which
        still need the executor), then shut the executor down.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.sender.close(timeout)
        finally:
            self.executor.shutdown(wait=True, timeout=timeout)

    def __repr__(self) -> str:
        return f"<TransactionalProducer group={self.group!r} closed={self._closed}>"
