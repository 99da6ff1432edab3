"""Driving a manual-clock broker (:mod:`.clock`) from a test: ``advance`` and ``check_now``.

Why a remoting request: the fixtures run the broker as a child process (``BrokerProcess``), and the
broker already serves remoting on its own port, so one txmsg-private request code
(:data:`TIME_CONTROL`, never used by RocketMQ) reaches it without a second channel.  It is registered
only on a broker started with ``manual_clock`` (``txmsg broker --manual-clock``): a production broker
neither has time control nor answers the code (REQUEST_CODE_NOT_SUPPORTED).  ``EmbeddedBroker`` runs
the same coroutine on its loop thread.

Actions (ext field ``action``):

* ``advance`` (``seconds``): move the clock, running every wait that became due in due order, each at
  its own time; returns once what ran is done, check-backs answered included.
* ``check_now``: the check service's next pass runs now (``ServiceThread.wakeup()``), without moving
  the clock, except through the pass's own 5.x pause (``SLEEP_WHILE_NO_OP``, 1 s) and what falls due
  during it; returns once the pass ended and its check-backs were answered.
* ``now``: only report.

Every answer is a :class:`ClockReport`: the clock's time, the check-backs sent while the request ran
and those not answered within ``answerTimeout`` wall seconds (a checker that hangs, a producer gone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .codec import SUCCESS, RemotingCommand
from .rawclient import call
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker
    from .clock import ManualClock

#: txmsg-private request code of the time control (issue 36); RocketMQ has none near it
TIME_CONTROL = 36036
#: how long (wall seconds) an action waits for check-back answers before reporting them unanswered
DEFAULT_ANSWER_TIMEOUT = 10.0


@dataclass(frozen=True)
class ClockReport:
    """What one time-control action did."""

    #: the broker's clock afterwards (ms since the epoch)
    now_ms: int
    #: check-backs sent while the action ran
    check_backs: int
    #: transaction ids of those check-backs not answered within the answer timeout
    unanswered: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClockReport:
        return cls(
            now_ms=int(data["now"]),
            check_backs=int(data["checkBacks"]),
            unanswered=tuple(str(u) for u in data.get("unanswered", ())),
        )


async def run_action(
    broker: Broker,
    clock: ManualClock,
    action: str,
    seconds: float = 0.0,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
) -> dict[str, Any]:
    """Run one action on the broker's loop; the report as JSON-ready data."""
    checks = broker.transactions.checks
    check_backs = broker.transactions.check_backs
    check_backs.answer_timeout = answer_timeout
    check_backs.unanswered.clear()
    sent_before = check_backs.checks_sent
    if action == "advance":
        await clock.advance(seconds)
    elif action == "check_now":
        before = checks.wake_check()
        await clock.run_until(lambda: checks.passes_done > before)
    elif action != "now":
        raise ValueError(f"unknown time-control action {action!r} (advance, check_now, now)")
    return {
        "now": clock.now(),
        "checkBacks": check_backs.checks_sent - sent_before,
        "unanswered": list(check_backs.unanswered),
    }


def install(broker: Broker, clock: ManualClock) -> None:
    """Serve :data:`TIME_CONTROL` on the broker port (manual-clock brokers only)."""

    async def handle(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            seconds = float(cmd.ext("seconds") or 0)
            answer_timeout = float(cmd.ext("answerTimeout") or DEFAULT_ANSWER_TIMEOUT)
        except ValueError as exc:
            raise ValueError(f"time control: {exc}") from None
        if seconds < 0:
            raise ValueError(f"the clock only moves forward, got {seconds} s")
        report = await run_action(broker, clock, cmd.ext("action"), seconds, answer_timeout)
        return cmd.response(body=json.dumps(report).encode())

    broker.register(TIME_CONTROL, handle)


def request(
    broker_addr: str,
    action: str,
    *,
    seconds: float = 0.0,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
    timeout: float = 300.0,
) -> ClockReport:
    """Send one action to the manual-clock broker at ``broker_addr`` and wait for its report."""
    response = call(
        broker_addr,
        TIME_CONTROL,
        {"action": action, "seconds": repr(float(seconds)), "answerTimeout": str(answer_timeout)},
        timeout=timeout,
    )
    if response.code != SUCCESS:
        raise RuntimeError(
            f"broker {broker_addr} refused {action}: {response.code} {response.remark} (was it "
            "started with manual_clock=True / --manual-clock?)"
        )
    return ClockReport.from_json(json.loads(response.body or b"{}"))
