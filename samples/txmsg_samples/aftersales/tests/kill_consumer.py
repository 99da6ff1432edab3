"""The settlement service as a child process of ``test_kill``: ``python -m
txmsg_samples.aftersales.tests.kill_consumer`` (config from ``$TXMSG_CONFIG``).

With ``AFTERSALES_TEST_READY=<file>`` it registers one more alert hook after the sample's own: it
writes the parked key to that file and then never returns.  txmsg calls hooks right after the park
committed and before the handler acknowledges the message, so the test's SIGKILL lands at a known
point: the key and its first message are parked, the message's offset is not committed, and the
key's later messages (queued behind it) are not consumed yet.

With ``AFTERSALES_TEST_INVISIBLE_S=<seconds>`` (the rocketmq5 backend) each receive asks for that
invisible time instead of ``txmsg_rocketmq5.receive.INVISIBLE_S`` (60 s, a module constant, no
setting): how long the broker waits before it hands the dead consumer's message again.  The test
uses 10 s, a RocketMQ 5 proxy's minimum: the same mechanism, 50 s less waiting."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from txmsg.orderly import ParkedEvent
from txmsg.sqla import make_session_factory
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.app import open_db, settlement_app
from txmsg_samples.aftersales.consumer import serve
from txmsg_samples.aftersales.settings import load


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    invisible = os.environ.get("AFTERSALES_TEST_INVISIBLE_S")
    if invisible:
        from txmsg_rocketmq5 import receive  # noqa: PLC0415 - only the rocketmq5 backend has it

        receive.INVISIBLE_S = int(invisible)  # ReceiveLoop reads the module global per receive
    config, settings = load()
    engine = open_db(settings.settlement_db, settlement.SettlementBase)
    app = settlement_app(config, settings, make_session_factory(engine))
    ready = os.environ.get("AFTERSALES_TEST_READY")
    if ready:

        def hold(event: ParkedEvent) -> None:
            # written whole, then renamed: the test reads the file as soon as it exists
            staged = Path(f"{ready}.part")
            staged.write_text(event.sharding_key)
            staged.replace(ready)
            threading.Event().wait()  # the test kills the process here

        app.on_parked(hold)
    serve(app)


if __name__ == "__main__":
    main()
