"""Run by test_rmq_optional_client.py in a child interpreter: an install without the optional
``rocketmq-client-python`` (extra ``rocketmq``), as ``pip install 'txmsg[rocketmq5]'`` leaves it:
``rocketmq.client`` / ``rocketmq.ffi`` do not exist and its distribution is not installed.

Prints one JSON line: what loading the ``rocketmq`` backend raised, and what its doctor check says.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import json
import sys

BLOCKED = ("rocketmq.client", "rocketmq.ffi")


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


_real_version = importlib.metadata.version


def version(distribution_name: str) -> str:
    if distribution_name == "rocketmq-client-python":
        raise importlib.metadata.PackageNotFoundError(distribution_name)
    return _real_version(distribution_name)


sys.meta_path.insert(0, Block())
importlib.metadata.version = version


def main() -> int:
    # only now, with the blocker in place (an install without the wrapper)
    from txmsg_rocketmq.doctor import report  # noqa: PLC0415

    from txmsg import BackendUnavailableError, TxMsg  # noqa: PLC0415
    from txmsg.config import TxMsgConfig  # noqa: PLC0415

    result: dict[str, object] = {}
    app = TxMsg(TxMsgConfig(backend="rocketmq"))
    try:
        app.backend  # noqa: B018 - creating the backend is what is tested
    except BackendUnavailableError as exc:
        result["error"] = type(exc).__name__
        result["message"] = str(exc)
    else:  # pragma: no cover - the test fails on this
        result["error"] = None
    app.close()
    result["doctor"] = report(None)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
