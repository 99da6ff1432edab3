"""5.x op batching: ``TransactionalOpBatchService`` with ``deletePrepareMessage``/``batchSendOpMessage``.

A 5.3.3 broker does not write the op record of a commit or rollback at once: the half-queue offset
joins a pending batch (body ``"<offset>,"`` per transaction), written as one op message when
``transaction_op_batch_interval_ms`` has passed since the last batch write, or at once when the batch
reaches ``transaction_op_msg_max_size`` bytes.  It lives apart from the service because it has its own
timer and its own failure (a batch that cannot be written is dropped, its halves are checked back),
and only a 5.x broker runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from .store import NotWritableError
from .transaction_formats import OP_BATCH_THREAD, op_offsets

if TYPE_CHECKING:
    from .transaction_service import TransactionService


class OpBatch:
    """The pending op records of half queue 0 (Java's ``MessageQueueOpContext``) and the task that
    writes them."""

    def __init__(self, service: TransactionService) -> None:
        self.service = service
        #: pending "<offset>," entries and their size in characters
        self.pending_ops: list[str] = []
        self.pending_size = 0
        #: ``MessageQueueOpContext.lastWriteTimestamp``: None until the first op (Java creates the context,
        #: stamped "now", at the first commit/rollback - so the first batch after a start waits 3-6 s)
        self.last_op_write_ms: int | None = None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, offset: int) -> None:
        """``deletePrepareMessage``: the half at ``offset`` ended; its op record waits in the batch."""
        service = self.service
        data = service.op_body(offset)
        if self.last_op_write_ms is None:
            self.last_op_write_ms = service.clock.now()
        self.pending_ops.append(data)
        self.pending_size += len(data)
        if self.pending_size > service.broker.config.transaction_op_msg_max_size:
            self._wakeup.set()

    def flush(self, *, now: int | None = None) -> int:
        """One ``batchSendOpMessage``: write the pending batch if it is due; return the next wake-up
        time in ms (0 = at once: more than one op message's worth is still pending)."""
        service = self.service
        cfg = service.broker.config
        start = service.clock.now() if now is None else now
        interval = cfg.op_batch_interval_ms
        max_size = cfg.transaction_op_msg_max_size
        last = self.last_op_write_ms
        if (
            not self.pending_ops
            or last is None
            or (self.pending_size < max_size and start - last < interval)
        ):
            return start + interval
        parts: list[str] = []
        length = 0
        while self.pending_ops and length < max_size:  # getOpMessage: up to ~maxSize characters
            data = self.pending_ops.pop(0)
            parts.append(data)
            length += len(data)
        self.pending_size -= length
        body = "".join(parts)
        self.last_op_write_ms = (
            service.clock.now()
        )  # getOpMessage stamps it after polling the batch
        try:
            service.store.put(service.op_message(body), defer_sync=True)
        except NotWritableError as exc:
            # Java logs and drops the batch: its halves get checked back
            service.tx.error(
                OP_BATCH_THREAD,
                f"Transaction batch op message write failed. body is {body}, queueId is 0 ({exc})",
            )
            return 0 if self.pending_size >= max_size else start + interval
        service.broker.request_sync()
        service.resolved.update(op_offsets(body.encode()))
        service.tx.debug(OP_BATCH_THREAD, "Send op message queueIds=[0]")
        return 0 if self.pending_size >= max_size else start + interval

    def start(self) -> None:
        self._task = self.service.broker.spawn(self._loop())

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._task = None
        # ServiceThread.shutdown wakes the thread for one last batchSendOpMessage: due ops only
        with contextlib.suppress(Exception):
            self.flush()
        self.service.tx.info(OP_BATCH_THREAD, "End transaction op batch thread!")

    async def _loop(self) -> None:
        """``TransactionalOpBatchService.run``: sleep until the wake-up time (or an oversize batch)."""
        service = self.service
        service.tx.info(OP_BATCH_THREAD, "Start transaction op batch thread!")
        wake = service.clock.now() + service.broker.config.op_batch_interval_ms
        while True:
            delay = wake - service.clock.now()
            if delay > 0:
                await service.clock.wait(self._wakeup, delay / 1000)
            self._wakeup.clear()
            try:
                wake = self.flush()
            except Exception as exc:  # noqa: BLE001 - "batchSendOp error.", the thread goes on
                service.tx.error(OP_BATCH_THREAD, f"batchSendOp error. {exc!r}")
                wake = 0
