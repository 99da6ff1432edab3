"""Run by test_rmq5_isolation.py in a child interpreter: the rocketmq5 backend with
``rocketmq.client``, ``rocketmq.ffi``, ``txmsg_rocketmq`` and librocketmq made unloadable.

``python no_librocketmq_script.py ENDPOINT TOPIC`` sends one COMMIT and one UNKNOW transaction through
a TxMsg app on backend rocketmq5 (chosen by TXMSG_BACKEND/TXMSG_ENDPOINTS), waits for the UNKNOW one's
check-back and prints one JSON line with what happened and what was imported.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import json
import os
import sys
import threading
from pathlib import Path
from typing import ClassVar

BLOCKED = ("rocketmq.client", "rocketmq.ffi", "txmsg_rocketmq")


class Block(importlib.abc.MetaPathFinder):
    attempts: ClassVar[list[str]] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in BLOCKED or name.startswith("txmsg_rocketmq."):
            self.attempts.append(name)
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked: librocketmq is absent)", name=name
            )
        return None


_real_cdll = ctypes.CDLL


def no_librocketmq(name: object, *args: object, **kwargs: object) -> object:
    if "rocketmq" in str(name):
        raise OSError(f"{name}: cannot open shared object file (blocked)")
    return _real_cdll(name, *args, **kwargs)  # type: ignore[arg-type]


sys.meta_path.insert(0, Block())
ctypes.CDLL = no_librocketmq  # type: ignore[misc,assignment]


def main(endpoint: str, topic: str) -> int:
    os.environ["TXMSG_BACKEND"] = "rocketmq5"
    os.environ["TXMSG_ENDPOINTS"] = endpoint
    from txmsg import ListenerRegistry, LocalTransactionState, TxMsg  # noqa: PLC0415 - only after the blocker and TXMSG_* are in place

    S = LocalTransactionState
    checked = threading.Event()
    registry = ListenerRegistry()

    @registry.transactional_listener(group="pg5_isolated", topics=[topic])
    class Listener:
        def execute_local(
            self, message: object, arg: LocalTransactionState
        ) -> LocalTransactionState:
            return arg

        def check_local(self, message: object) -> LocalTransactionState:
            checked.set()
            return S.COMMIT

    app = TxMsg()
    app.include(registry)
    with app:
        producer = app.producer("pg5_isolated")
        states = [
            producer.send_in_transaction(topic, "x", arg=s).local_state.name
            for s in (S.COMMIT, S.UNKNOW)
        ]
        got_check = checked.wait(20)
    proc_maps = Path("/proc/self/maps")
    maps = proc_maps.read_text() if proc_maps.exists() else ""
    print(
        json.dumps(
            {
                "backend": type(app.backend).__module__,
                "states": states,
                "checked": got_check,
                "imported": sorted(
                    m for m in sys.modules if m in BLOCKED or m.startswith("txmsg_rocketmq.")
                ),
                "attempts": Block.attempts,
                "librocketmq_mapped": "librocketmq" in maps,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
