"""A Spark standalone cluster on this machine, from the venv's own pyspark: one master, N workers.

What the ``spark_cluster`` fixture (``tests/health/conftest.py``) starts, the way an operator
would (``docs/health.md``, "Running on a Spark cluster"): ``spark-class`` of the pyspark
package runs ``org.apache.spark.deploy.master.Master`` and ``...worker.Worker``; nothing is
downloaded.

* Loopback only: ``SPARK_LOCAL_IP`` / ``SPARK_LOCAL_HOSTNAME`` = 127.0.0.1 for every JVM (the web
  UIs bind 0.0.0.0 without it), and the master's REST submission server (a fixed port, 6066, on
  by default in Spark 4) is off.
* Ports: every port is 0, so the JVM picks a free one and nothing can take it between a probe
  and the bind; the master's ports are read back from its log ("Successfully started service
  'sparkMaster' on port N", the same for 'MasterUI').
* Ready = the event: the master's JSON (``/json/``) reports every worker ALIVE, polled with a
  bounded timeout; a daemon that exits early fails at once, with the tail of its log.
* Isolation: ``SPARK_CONF_DIR`` is an empty directory (no spark-env.sh or spark-defaults.conf of
  the machine), work and scratch directories live under the given root.
* Teardown: every daemon runs in a process group of its own (executors are its children), which
  gets SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

LOOPBACK = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_SERVICE_PORT = "Successfully started service '{}' on port (\\d+)"
#: what a driver process started by a test must not inherit from a test process that runs a
#: SparkSession of its own (pyspark would connect to that JVM instead of launching one)
GATEWAY_ENV = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")

#: the JIT of every JVM a test starts for seconds (the command-line runs, this cluster's
#: daemons and executors): C1 only, no C2. Such a JVM spends most of its CPU compiling code it
#: then runs for a moment, and the suite is CPU-bound (docs/guide/testing.md, "What the suite
#: spends"). The session's own JVM (fixture ``spark``), which runs the long scans, keeps the
#: full JIT. Test set-up only: the job's JVM options are untouched.
SHORT_JIT = "-XX:TieredStopAtLevel=1"

T = TypeVar("T")


def with_short_jit(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`SHORT_JIT` added to ``JAVA_TOOL_OPTIONS`` (read by every JVM at start)."""
    options = env.get("JAVA_TOOL_OPTIONS", "")
    if SHORT_JIT not in options.split():
        env["JAVA_TOOL_OPTIONS"] = f"{options} {SHORT_JIT}".strip()
    return env


def spark_home() -> Path:
    """The pyspark package directory: it holds ``bin/spark-class`` and the jars."""
    import pyspark  # noqa: PLC0415 - optional: the spark extra

    return Path(pyspark.__file__).resolve().parent


def loopback_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with Spark kept on 127.0.0.1."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in GATEWAY_ENV}
    env.update(SPARK_LOCAL_IP=LOOPBACK, SPARK_LOCAL_HOSTNAME=LOOPBACK)
    return env


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            text = ["(no log)"]
        return f"--- {self.name} (pid {self.proc.pid}, exit {self.proc.poll()}) {self.log}:\n" + (
            "\n".join(text)
        )


@dataclass
class Cluster:
    """A running standalone cluster: ``url`` is what ``--master`` takes."""

    url: str
    webui: str
    root: Path
    daemons: list[Daemon] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's JSON: workers, cores, active and completed applications."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as r:  # noqa: S310 - http://127.0.0.1
            return dict(json.load(r))

    def driver_env(self) -> dict[str, str]:
        """The environment for a driver process (``txmsg health --master URL``) on this cluster:
        the driver also on 127.0.0.1, which is where the executors connect back to it."""
        return loopback_env()

    def logs(self) -> str:
        """The tail of every daemon's log, for failure messages."""
        return "\n".join(d.tail() for d in self.daemons)


def _wait(what: str, probe: Callable[[], T | None], daemons: list[Daemon], timeout: float) -> T:
    """Poll ``probe`` until it returns a value; fail when a daemon exits or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        dead = [d for d in daemons if d.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{dead[0].name} exited" if dead else f"not within {timeout:g} s"
            raise RuntimeError(
                f"Spark standalone cluster: waiting for {what}: {why}\n"
                + "\n".join(d.tail() for d in daemons)
            )
        time.sleep(0.2)


def _log_port(daemon: Daemon, service: str) -> int | None:
    try:
        m = re.search(_SERVICE_PORT.format(service), daemon.log.read_text(errors="replace"))
    except FileNotFoundError:
        return None
    return int(m.group(1)) if m else None


def _alive_workers(webui: str) -> int:
    try:
        with urllib.request.urlopen(f"{webui}/json/", timeout=5) as r:  # noqa: S310 - http://127.0.0.1
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError, urllib.error.URLError):
        return 0  # not serving yet


def _stop(daemons: list[Daemon], grace: float = 30.0) -> None:
    """SIGTERM every daemon's process group (executors included), SIGKILL what is left."""
    for d in reversed(daemons):  # workers first: they stop their executors
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for d in daemons:
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.proc.pid, signal.SIGKILL)  # the group: also executors left behind
        d.proc.wait()


@contextlib.contextmanager
def standalone(
    root: Path,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    timeout: float = 180.0,
) -> Iterator[Cluster]:
    """Start a master and ``workers`` workers under ``root``; yield once all are registered."""
    home = spark_home()
    conf_dir, scratch = root / "conf", root / "local"
    conf_dir.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(exist_ok=True)
    props = conf_dir / "daemons.conf"
    props.write_text("spark.master.rest.enabled false\n")
    env = with_short_jit(loopback_env())
    env.update(
        SPARK_HOME=str(home),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_DIRS=str(scratch),  # the workers' and so the executors' scratch space
        SPARK_DAEMON_MEMORY="256m",  # the master and worker JVMs only, not the executors
    )
    daemons: list[Daemon] = []

    def launch(name: str, *args: str) -> Daemon:
        log = root / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args, "--properties-file", str(props)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
                start_new_session=True,  # a process group of its own: killed as a whole
            )
        daemons.append(Daemon(name, proc, log))
        return daemons[-1]

    try:
        master = launch(
            "master", MASTER_CLASS, "--host", LOOPBACK, "--port", "0", "--webui-port", "0"
        )
        port = _wait(
            "the master's RPC port", lambda: _log_port(master, "sparkMaster"), daemons, timeout
        )
        ui = _wait(
            "the master's web UI port", lambda: _log_port(master, "MasterUI"), daemons, timeout
        )
        url, webui = f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{ui}"
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            launch(
                f"worker-{i}",
                WORKER_CLASS,
                url,
                "--host",
                LOOPBACK,
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--work-dir",
                str(work),
            )
        _wait(
            f"{workers} workers ALIVE at {webui}/json/",
            lambda: True if _alive_workers(webui) >= workers else None,
            daemons,
            timeout,
        )
        yield Cluster(url, webui, root, daemons)
    finally:
        _stop(daemons)


def main() -> int:
    """``python tests/health/cluster.py ROOT``: start a cluster, print its URL, run until Ctrl-C."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "spark-cluster").resolve()
    root.mkdir(parents=True, exist_ok=True)
    stop = {signal.SIGINT, signal.SIGTERM}
    with standalone(root) as c:
        # blocked only now: the daemons would inherit the mask; sigwait takes them instead
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        print(f"{c.url}  (web UI {c.webui})", flush=True)
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
