"""A synchronous send that librocketmq failed at once, tried once more (librocketmq hazard #11).

librocketmq 2.1.0 keeps one TCP connection per broker address per client factory.  While one
thread of the factory is still connecting to an address (``TCP_CONNECT_STATUS_WAIT`` in
``TcpRemotingClient::CreateTransport``), every other thread that asks for that connection gets
*none*, at once, and its send fails without a byte on the wire.  A sync send retries twice within
the same millisecond and fails the same way; an ordered send (no retries) fails outright; the
error says "No route info of this topic".  The connect in question is usually the factory's own
heartbeat, which its first timer sends about 10 ms after the client starts, so a service that
sends right after ``app.start()`` met it (seen once in CI: the heartbeat's connect began 0.1 ms
before an ordered send, which failed 0.2 ms later; the connect finished 0.8 ms after that), and
again whenever a connection is made afresh (a broker restarted, a new broker in the cluster).

A failure that fast stored nothing: a stored message whose answer was lost fails only after the
send timeout (3 s), and a stored message whose flush or slave timed out is answered with a send
status, not a failure.  A broker's fast refusal (no permission, no such topic) stored nothing
either.  So such a send is tried once more after :data:`RETRY_AFTER`, with the same native
message (the same ``UNIQ_KEY``): at worst a refusal comes twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .native import OK

log = logging.getLogger("txmsg.rocketmq")

INSTANT = 0.1
"""Seconds within which a failed send cannot have been on the wire (a connect still under way
fails in well under a millisecond; the client's send timeout is 3 s)."""
RETRY_AFTER = 0.05
"""Seconds before the one retry: a loopback or LAN connect completes well within them."""


def send_retrying_instant_failure(
    call: Callable[[], int], *, retry_allowed: Callable[[], bool] = lambda: True, what: str
) -> int:
    """``call()`` (a synchronous native send returning librocketmq's status) and, when it failed
    within :data:`INSTANT` and ``retry_allowed()``, once more after :data:`RETRY_AFTER`."""
    began = time.monotonic()
    status = int(call())
    if status == OK or time.monotonic() - began >= INSTANT or not retry_allowed():
        return status
    log.debug("%s failed at once (a connection still being made?); trying it once more", what)
    time.sleep(RETRY_AFTER)
    return int(call())
