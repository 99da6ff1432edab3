"""A broker started as a child process (the pytest fixtures, benchmarks, ``--brokers N``) ends
when its parent does, even a parent killed with SIGKILL: it reads end of file on the stdin pipe
only the parent held and shuts down cleanly (``txmsg_broker.childproc.exit_with_parent``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from txmsg_broker.testing import wait_until

PARENT = textwrap.dedent(
    """
    import sys, time
    from txmsg_broker.app import BrokerProcess

    broker = BrokerProcess(data_dir=sys.argv[1] + "/data", log_dir=sys.argv[1] + "/logs",
                           namesrv_port=0, broker_port=0).start()
    print(broker.proc.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent, killed, cannot reap it; init will)
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def test_a_child_broker_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        wait_until(lambda: not _alive(child), timeout=30, message=f"broker {child} to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    console = (tmp_path / "logs" / "console.log").read_text(errors="replace")
    assert "Traceback" not in console  # a clean SIGTERM shutdown, not a crash
