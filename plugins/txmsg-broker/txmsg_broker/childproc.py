"""A txmsg_broker command in a child process: start it, wait for its ready line, stop or kill it.

Why a base class: the broker (:class:`txmsg_broker.app.BrokerProcess`) and the stand-alone name
server (:class:`txmsg_broker.cluster.NamesrvProcess`) are started the same way by tests, benchmarks
and ``txmsg broker --brokers N``: output appended to ``console.log`` in the log directory, readiness
read from the line the command prints once it accepts connections (only the part written by this
start, so a restart does not see the previous run's line), its own session so a test's SIGKILL
reaches only it.

A child also ends when its parent does, even a parent killed with SIGKILL: its stdin is a pipe
only the parent holds, and the child (:func:`exit_with_parent`) stops itself cleanly when that
pipe reaches end of file.  Without it a test run or benchmark that was killed left its brokers
running, holding ports and files, until someone found them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

EXIT_WITH_PARENT_ENV = "TXMSG_EXIT_WITH_PARENT"
"""Set to ``1`` in a child's environment by :class:`ChildProcess`: its stdin is the parent's pipe."""


def exit_with_parent() -> None:
    """In a command started by :class:`ChildProcess`: SIGTERM this process (the clean shutdown
    its signal handler runs) once the parent's end of stdin closes, i.e. the parent is gone.
    Does nothing in a command started any other way (a shell, a service manager)."""
    if os.environ.pop(EXIT_WITH_PARENT_ENV, None) != "1":  # popped: not for our own children
        return

    def watch() -> None:
        # os.read on the descriptor, not sys.stdin: a daemon thread blocked inside the buffered
        # reader holds its lock, and an interpreter exiting meanwhile (a start that failed) then
        # aborts with "Fatal Python error: _enter_buffered_busy" (SIGABRT) instead of its exit code
        try:
            while os.read(stdin_fd, 4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        stdin_fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdin: nothing to watch
        return

    threading.Thread(target=watch, name="txmsg-parent-watch", daemon=True).start()


class ChildProcess:
    """One child process whose console goes to ``log_dir/console.log``; ``kill()`` is a real SIGKILL."""

    what = "process"
    """How errors name it ("broker process", "name server")."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.console_path = self.log_dir / "console.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def _spawn(self, ready: re.Pattern[str], timeout: float) -> tuple[re.Match[str], str]:
        """Start :meth:`command` and wait until ``ready`` matches what it printed since; returns
        the match and that text.  Raises RuntimeError (it exited, with its output) or TimeoutError (killed)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        start_pos = self.console_path.stat().st_size if self.console_path.exists() else 0
        env = {**os.environ, EXIT_WITH_PARENT_ENV: "1"}
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.console_path, "ab") as console:
            self.proc = subprocess.Popen(  # noqa: S603 - command(): this interpreter and our own options
                self.command(),
                stdin=subprocess.PIPE,  # never written: its end of file tells the child we are gone
                stdout=console,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.console_path, "rb") as fh:
                fh.seek(start_pos)
                text = fh.read().decode(errors="replace")
            match = ready.search(text)
            if match:
                return match, text
            if self.proc.poll() is not None:
                self._close_pipe()
                raise RuntimeError(
                    f"{self.what} exited with {self.proc.returncode} before accepting connections:\n{text}"
                )
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"{self.what} did not accept connections within {timeout} s")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (clean shutdown, flushes everything); SIGKILL if it does not exit in time.
        Returns the exit code (None if it was not started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self._close_pipe()
        self.proc = None
        return code

    def kill(self) -> None:
        """``kill -9``: no shutdown hooks, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipe()
        self.proc = None

    def _close_pipe(self) -> None:
        """Close our end of the child's stdin (once it has exited: closing it earlier stops it)."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def console(self) -> str:
        return self.console_path.read_text(errors="replace") if self.console_path.exists() else ""
