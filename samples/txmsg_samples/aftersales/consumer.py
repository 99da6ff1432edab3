"""Run the settlement service: ``python -m txmsg_samples.aftersales.consumer`` (Ctrl-C / SIGTERM stops).

Reads ``$TXMSG_CONFIG`` or the sample's ``txmsg.toml``; consumes until stopped.  A parked order is
logged at ERROR and appended to ``alerts_file``; replay it with
``txmsg parked retry --app txmsg_samples.aftersales.app:create_app --group aftersales-settlement --key ORDER``.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from txmsg import TxMsg
from txmsg_samples.aftersales.app import create_app


def serve(app: TxMsg) -> None:
    """Start ``app``, consume until SIGTERM or SIGINT, then close it (consumers stop, offsets
    are committed)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with app:
        print("settlement service consuming; SIGTERM or Ctrl-C stops", flush=True)
        stop.wait()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    serve(create_app())


if __name__ == "__main__":
    main()
