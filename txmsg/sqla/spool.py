"""The orderly in-flight journal's local tier: an append-only file per consumer process.

Why: the in-flight journal (:mod:`txmsg.sqla.journal`, librocketmq hazard #10) must hold every
orderly message from before its listener runs until it is consumed or parked.  A database
transaction per message (two, with the delete) costs several times what librocketmq itself
spends on a message (docs/guide/ordered.md#measured).  What the journal is
there for is a *process* that dies in a callback (SIGKILL, OOM killer, a crash in native code),
and for that a ``write(2)`` into a file is enough: once the call returns the record is in the
kernel's page cache, which the death of the process does not touch.

Format: one line per record, appended with a single ``os.write`` on an ``O_APPEND`` descriptor
(a record is whole or absent after a kill; a torn last line, which only a machine crash can leave,
is ignored on reading)::

    H <owner json>                 first line: the owner (host:pid:token) its rows get
    B <seq> <message json>         the message is in its listener from now on
    E <seq>                        ... and is consumed, parked, or handed to the database tier

Files live in ``<directory>/<host>/<group>/<pid>-<token>.spool``.  The writer holds an exclusive
``flock`` on its file for as long as it lives: the kernel drops the lock when the process dies,
however it dies, so "can I lock it?" is an exact liveness test that pid reuse (containers restart
with the same pids) cannot fool.  A file whose lock is free belongs to a dead process; its open
entries (``B`` without ``E``) are moved into the database tier by whoever finds them
(:meth:`~txmsg.sqla.journal_sweeper.JournalSweeper.import_spools`).

Durability, exactly: no ``fsync``.  A record survives the death of the process that wrote it, not
the machine's (power loss, kernel panic, a VM reset may drop the last seconds of records; the
operating system writes dirty pages back within about 30 s by default).  And a file is read only
on the host that wrote it: see docs/guide/ordered.md for what that leaves to the database tier.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import itertools
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from txmsg.errors import ClosedError
from txmsg.message import Message

log = logging.getLogger("txmsg.journal")

DIRECTORY_ENV = "TXMSG_INFLIGHT_DIR"
"""Overrides where spool files live (a persistent volume in a container, for instance)."""
ROTATE_BYTES = 4 * 1024 * 1024
"""A spool file is rewritten (open entries only) into a new one past this size."""
SUFFIX = ".spool"


def default_directory(engine: Engine | None) -> Path:
    """Where the spools of a database's orderly listeners live, the same for every process of the
    host that uses that database: ``$TXMSG_INFLIGHT_DIR``; else, for a SQLite file, next to it
    (``orders.db-txmsg-inflight``); else ``$XDG_STATE_HOME/txmsg/inflight/<hash of the URL>``
    (``~/.local/state`` by default; the password is not part of the hash)."""
    override = os.environ.get(DIRECTORY_ENV)
    if override:
        return Path(override)
    if engine is not None and engine.dialect.name == "sqlite" and engine.url.database:
        return Path(os.path.abspath(engine.url.database + "-txmsg-inflight"))
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    url = engine.url.render_as_string(hide_password=True) if engine is not None else "default"
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(state) / "txmsg" / "inflight" / digest


def _safe(name: str) -> str:
    """A directory name for a host identity or consumer group (any characters in, [\\w.-] out,
    with a hash so two names that differ only in the replaced characters stay apart)."""
    cleaned = re.sub(r"[^\w.-]", "_", name)[:80]
    return (
        cleaned if cleaned == name else f"{cleaned}~{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    )


def group_directory(directory: Path, host: str, group: str) -> Path:
    return directory / _safe(host) / _safe(group)


_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every record: ``json.dumps`` with options builds a new one per call, which
every consumed orderly message paid (docs/guide/ordered.md, *Measured*)."""


def encode(message: Message) -> bytes:
    """A message as one line of JSON (the body base64, since it is bytes)."""
    return _ENCODER.encode(
        [
            message.topic,
            binascii.b2a_base64(message.body, newline=False).decode("ascii"),
            message.tags,
            message.keys,
            message.properties,
            message.message_id,
            message.reconsume_times,
            message.sharding_key,
            message.queue_id,
            message.queue_offset,
        ]
    ).encode()


def decode(data: bytes) -> Message:
    topic, body, tags, keys, properties, message_id, reconsume, sharding, queue, offset = (
        json.loads(data)
    )
    return Message(
        topic=topic,
        body=base64.b64decode(body),
        tags=tags,
        keys=keys,
        properties=dict(properties),
        message_id=message_id,
        reconsume_times=reconsume,
        sharding_key=sharding,
        queue_id=queue,
        queue_offset=offset,
    )


class Spool:
    """This process's spool file for one consumer group (thread-safe)."""

    def __init__(self, directory: Path, owner: str) -> None:
        self.directory = directory
        self.owner = owner
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._open: dict[int, bytes] = {}
        """seq -> the B record of every entry not ended yet (rewritten on rotation)."""
        self._fd = -1
        self._path: Path | None = None
        self._size = 0
        self.closed = False

    @property
    def path(self) -> Path | None:
        return self._path

    def _new_file(self) -> tuple[int, Path]:
        self.directory.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        path = self.directory / f"{pid}-{uuid.uuid4().hex[:12]}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            header = b"H " + json.dumps(self.owner).encode() + b"\n"
            os.write(fd, header)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return fd, path

    def begin(self, message: Message) -> int:
        """Append ``message``'s B record; its sequence number (for :meth:`end`)."""
        seq = next(self._seq)
        record = b"B %d %s\n" % (seq, encode(message))
        with self._lock:
            if self._fd < 0:
                if self.closed:
                    raise ClosedError(
                        "the in-flight spool is closed: its orderly consumer was closed; a "
                        "message consumed now must go through a consumer that is running"
                    )
                self._fd, self._path = self._new_file()
                self._size = 0
            elif self._size > ROTATE_BYTES:
                self._rotate()
            os.write(self._fd, record)
            self._size += len(record)
            self._open[seq] = record
        return seq

    def end(self, seq: int) -> None:
        """Append the E record of ``seq``: nothing to recover for it any more."""
        record = b"E %d\n" % seq
        with self._lock:
            if self._open.pop(seq, None) is None or self._fd < 0:
                return
            os.write(self._fd, record)
            self._size += len(record)

    def _rotate(self) -> None:
        """Under the lock: a new file with the open entries, then the old one goes.  Killed in
        between, both files hold those entries; the import keeps one row per message."""
        fd, path = self._new_file()
        data = b"".join(self._open.values())
        if data:
            os.write(fd, data)
        old_fd, old_path = self._fd, self._path
        self._fd, self._path, self._size = fd, path, len(data)
        if old_path is not None:
            old_path.unlink(missing_ok=True)
        os.close(old_fd)

    def open_entries(self) -> int:
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        """Remove the file if nothing is open in it (a clean stop); else leave it for the import
        (the lock goes with the descriptor)."""
        with self._lock:
            self.closed = True
            if self._fd < 0:
                return
            if not self._open and self._path is not None:
                self._path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class Orphan:
    """What a dead process's spool file held: its owner and the messages it never ended."""

    path: Path
    owner: str
    messages: list[Message]


def read_entries(data: bytes) -> tuple[str | None, list[Message]]:
    """The owner and the open entries (B without E, in the order written) of a spool file's
    contents; a line that does not parse (a torn tail) is skipped."""
    owner: str | None = None
    begun: dict[int, bytes] = {}
    for line in data.split(b"\n"):
        kind, _, rest = line.partition(b" ")
        try:
            if kind == b"H":
                owner = str(json.loads(rest))
            elif kind == b"B":
                seq, _, payload = rest.partition(b" ")
                begun.setdefault(int(seq), payload)
            elif kind == b"E":
                begun.pop(int(rest), None)
        except ValueError:
            continue
    messages: list[Message] = []
    for payload in begun.values():
        try:
            messages.append(decode(payload))
        except (ValueError, TypeError, KeyError):
            log.warning("skipping an unreadable in-flight spool record", exc_info=True)
    return owner, messages


@dataclass
class Claimed:
    """A dead process's spool file, locked by this process until :meth:`close`."""

    orphan: Orphan
    fd: int

    def remove(self) -> None:
        self.orphan.path.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self.fd)


def orphans(directory: Path, skip: Path | None = None) -> Iterator[Claimed]:
    """Spool files of dead processes in ``directory`` (one group of one host), each locked while
    the caller handles it: two processes never import the same file at once."""
    for path, fd in _open_spools(directory, skip):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its writer lives
            os.close(fd)
            continue
        try:
            # gone meanwhile (another importer finished it before we locked it)?
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                raise FileNotFoundError(path)
            data = _read_all(fd)
        except OSError:
            os.close(fd)
            continue
        owner, messages = read_entries(data)
        yield Claimed(Orphan(path, owner or f"unknown:{path.stem}", messages), fd)


def live_open_entries(directory: Path, skip: Path | None = None) -> list[Message]:
    """The open entries of the spool files in ``directory`` whose writers live (other than
    ``skip``): messages another process of the group on this host has in its listener now.

    Why: librocketmq 2.1.0 hands a queue to another consumer in a rebalance without waiting for
    the callback running on it (hazard #10), so the new owner must not start the key's next
    message while that callback runs.  Read without a lock: each record is one ``O_APPEND``
    write, and a torn last line is skipped; an entry ended meanwhile only makes the caller wait
    for one more look."""
    found: list[Message] = []
    for _path, fd in _open_spools(directory, skip):
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:  # its writer lives: what is in its listener?
                found.extend(read_entries(_read_all(fd))[1])
            # else: a dead process's file, which import_spools moves into the table
        except OSError:
            continue
        finally:
            os.close(fd)
    return found


def _open_spools(directory: Path, skip: Path | None) -> Iterator[tuple[Path, int]]:
    """Each spool file in ``directory`` but ``skip``, opened read-only (the caller closes it);
    files gone meanwhile are passed over."""
    try:
        paths = sorted(directory.glob(f"*{SUFFIX}"))
    except OSError:
        return
    for path in paths:
        if skip is not None and path == skip:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        yield path, fd


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
