"""What the broker does when its store cannot append (full disk, I/O error) - as 4.9.8 answers.

A real 4.9.8 broker marks its store not writable (``RunningFlags``: disk full above
``diskSpaceWarningLevelRatio``, or a failed write to a logic queue / index) and then refuses every
put in ``checkStoreStatus`` with ``SERVICE_NOT_AVAILABLE``, which ``SendMessageProcessor`` answers as
response code 14 with the remark :func:`refusal_remark` reproduces (``diskUtil()`` included). Ours
marks itself not writable when an append actually fails (``ENOSPC`` or any ``OSError``; the store
cuts the partial record off, see :mod:`txmsg_broker.store`) and tries the next put again, so it
recovers as soon as space returns - no usage threshold, no restart.

``broker.log`` gets one ERROR line when appends start failing (naming the data dir and what to do),
one ERROR line at most every :data:`REPEAT_SECONDS` while they keep failing, and an INFO line when
an append succeeds again. Reads (pulls, offsets, routes, heartbeats) never touch the append path.
"""

from __future__ import annotations

import errno
import threading
import time
from typing import TYPE_CHECKING

from .codec import SERVICE_NOT_AVAILABLE, RemotingCommand

if TYPE_CHECKING:
    from .broker import Broker

THREAD = "SendMessageThread_1"
REPEAT_SECONDS = 10.0


def refusal_remark(broker: Broker) -> str:
    """4.9.8's remark for ``PutMessageStatus.SERVICE_NOT_AVAILABLE``, word for word."""
    return (
        "service not available now. It may be caused by one of the following reasons: "
        f"the broker's disk is full [{broker.store.disk_util()}], messages are put to the slave, "
        "message store has been shut down, etc."
    )


def refuse(broker: Broker, cmd: RemotingCommand) -> RemotingCommand:
    """The response to a send the store could not append: code 14, nothing stored."""
    return cmd.error(SERVICE_NOT_AVAILABLE, refusal_remark(broker))


def install(broker: Broker) -> None:
    """Log the store's writable changes in ``broker.log``."""
    state = {"last": 0.0}
    lock = threading.Lock()
    data_dir = broker.config.data_dir

    def changed(writable: bool, exc: OSError | None) -> None:
        log = broker.logs.broker
        store = broker.store
        if writable:
            log.info(
                THREAD,
                f"the message store is writable again (data dir {data_dir}, {store.disk_util()}): "
                f"appends succeed, {store.write_failures} puts were refused while it was not",
            )
            return
        now = time.monotonic()
        with lock:
            first = store.write_failures == 1
            if not first and now - state["last"] < REPEAT_SECONDS:
                return
            state["last"] = now
        name = errno.errorcode.get(exc.errno or 0, "EIO") if exc is not None else "EIO"
        what = (
            "the disk is full"
            if exc is not None and exc.errno == errno.ENOSPC
            else "a write failed"
        )
        if first:
            log.error(
                THREAD,
                f"the message store is not writable: {what} - cannot append to the commit log in "
                f"{data_dir} ({name}: {exc.strerror if exc is not None else ''}) [{store.disk_util()}]. "
                "Sends are refused with SERVICE_NOT_AVAILABLE (14), nothing is stored or acknowledged; "
                "pulls, offsets and routes are still served. Free space on that file system (or give "
                "the broker a larger --data-dir); it recovers by itself with the next send, no restart.",
            )
        else:
            log.error(
                THREAD,
                f"the message store is still not writable ({name}, data dir {data_dir}, "
                f"{store.disk_util()}): {store.write_failures} puts refused so far",
            )

    broker.store.on_writable_change = changed
