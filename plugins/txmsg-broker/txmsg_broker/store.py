"""Append-only commit log + in-memory consume queues + persisted consumer offsets.

Why this shape: it is RocketMQ's own (one commit log, per-queue indexes of commit-log offsets), so
recovery is "re-read the log", half/op/retry/schedule topics are just topics, and a stored record is
byte-for-byte a PULL body entry.

Durability (also in the README):

* every ``put`` hands its record to the OS with one ``write`` before returning, so a ``kill -9`` of the
  broker loses nothing that was acknowledged, in both modes;
* ``flush="sync"`` also ``fdatasync``\\s before returning (survives power loss);
* ``flush="async"`` ``fdatasync``\\s from ``flush()`` (the broker calls it every 500 ms), so a power loss
  can lose at most that unflushed tail.

On start ``recover()`` scans the log, verifies every record (magic, size, body CRC), cuts off a torn
tail and rebuilds the consume queues.

A full disk (``ENOSPC``) or any other ``OSError`` while appending raises :class:`NotWritableError`
and stores nothing: the log is cut back to the end of the last complete record (if even that fails,
the next append retries the cut before writing, and ``recover()`` drops the torn tail on restart), the
consume queues are untouched, and the store is marked not writable until an append succeeds again.
Reads never depend on it. ``on_writable_change`` tells the broker, which logs it in ``broker.log``. Consumer offsets live in ``config/consumerOffset.json`` (written
atomically; on every commit in sync mode, from ``flush()`` in async mode).

Stored messages returned by this class are shared with its cache: treat them as read-only and use
``dataclasses.replace`` to derive new ones.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .clock import Clock, RealClock
from .message_codec import (
    FIXED_SIZE,
    MAGIC,
    StoredMessage,
    clone,
    decode_message,
    encode_message,
    offset_msg_id,
)

__all__ = ["MessageStore", "NotWritableError", "PutListener", "StoredMessage", "disk_used_ratio"]

log = logging.getLogger("txmsg_broker.store")

PutListener = Callable[[StoredMessage], None]
FlushMode = Literal["sync", "async"]

_CACHE_LIMIT = 16384
_RECOVER_CHUNK = 8 * 1024 * 1024


def now_ms() -> int:
    return int(time.time() * 1000)


class NotWritableError(OSError):
    """The commit log could not be appended to (disk full, I/O error): nothing of the put was stored.

    An ``OSError`` with the cause's errno, so code that handles I/O errors handles this one too.
    """

    def __init__(self, data_dir: Path, cause: OSError) -> None:
        super().__init__(
            cause.errno,
            f"cannot append to the commit log in {data_dir}: {cause.strerror or cause}",
        )
        self.data_dir = data_dir
        self.cause = cause


def disk_used_ratio(path: str | os.PathLike[str]) -> float:
    """Used fraction of the file system holding ``path`` as 4.9.8's
    ``UtilAll.getDiskPartitionSpaceUsedPercent`` computes it (0..1, rounded up to 0.01); -1 if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return -1.0
    used = total - st.f_bfree * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if entire <= 0:
        return -1.0
    percent = used * 100 // entire + (1 if used * 100 % entire else 0)
    return percent / 100.0


#: ``writable, error`` - called when appends start failing (``False``, the error) and when one
#: succeeds again (``True``, None); also on every later failure while not writable
WritableListener = Callable[[bool, OSError | None], None]


class MessageStore:
    """See the module docstring. All public methods are thread-safe."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        flush: FlushMode = "async",
        *,
        store_host: str = "127.0.0.1:10911",
        clock: Clock | None = None,
    ) -> None:
        if flush not in ("sync", "async"):
            raise ValueError(f"flush must be 'sync' or 'async', got {flush!r}")
        self.data_dir = Path(data_dir)
        self.flush_mode: FlushMode = flush
        self.store_host = store_host
        #: stamps ``storeTimestamp`` (the broker's clock, :mod:`.clock`: delay levels count from it)
        self.clock: Clock = clock if clock is not None else RealClock()
        (self.data_dir / "commitlog").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "config").mkdir(parents=True, exist_ok=True)
        self._log_path = self.data_dir / "commitlog" / "00000000000000000000"
        self._offsets_path = self.data_dir / "config" / "consumerOffset.json"
        self._lock = threading.RLock()
        self._fd = os.open(self._log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = 0
        self._queues: dict[tuple[str, int], array[int]] = {}
        self._sizes: dict[tuple[str, int], array[int]] = {}
        self._cache: dict[int, StoredMessage] = {}
        self._offsets: dict[str, dict[str, int]] = {}  # "topic@group" -> {queue_id: offset}
        self._log_dirty = False
        self._offsets_dirty = False
        self._closed = False
        self._offsets_write_error: OSError | None = None
        self._tail_dirty = False  # a failed append whose cut-back also failed: cut before writing
        self.writable = True
        """False from a failed append until the next one succeeds (reads are unaffected)."""
        self.write_failures = 0
        """Puts refused since the store last became not writable."""
        self.on_writable_change: WritableListener | None = None
        self.listeners: list[PutListener] = []
        self.recover()

    # ------------------------------------------------------------------------------------------
    # writing
    def on_put(self, listener: PutListener) -> None:
        """Call ``listener(msg)`` after every put (any topic; filter on ``msg.topic``). Must not block."""
        self.listeners.append(listener)

    def put(self, msg: StoredMessage, *, defer_sync: bool = False) -> StoredMessage:
        """Append one message; returns a copy with store timestamp, offsets and msg id assigned."""
        return self.put_many([msg], defer_sync=defer_sync)[0]

    def put_many(
        self, msgs: list[StoredMessage], *, defer_sync: bool = False
    ) -> list[StoredMessage]:
        """Append several messages with one write (and one fsync in sync mode).

        ``defer_sync=True`` skips the sync-mode fsync: the caller promises to call ``sync()`` (e.g. the
        broker's group commit) before acknowledging.
        """
        stored: list[StoredMessage] = []
        with self._lock:
            self._check_open()
            for msg in msgs:
                self.clock.observe(msg.born_timestamp)
            ts = self.clock.now()
            chunks: list[bytes] = []
            pos = self._size
            pending_q: dict[tuple[str, int], int] = {}
            for msg in msgs:
                key = (msg.topic, msg.queue_id)
                queue = self._queues.get(key)
                base = len(queue) if queue is not None else 0
                qoff = base + pending_q.get(key, 0)
                pending_q[key] = pending_q.get(key, 0) + 1
                new = clone(
                    msg,
                    store_timestamp=ts,
                    store_host=self.store_host,
                    commit_log_offset=pos,
                    queue_offset=qoff,
                    msg_id=offset_msg_id(self.store_host, pos),
                )
                record = encode_message(new)
                chunks.append(record)
                pos += len(record)
                stored.append(new)
            data = b"".join(chunks)
            try:
                self._repair_tail()
                self._write_all(data)
                if self.flush_mode == "sync" and not defer_sync:
                    os.fdatasync(self._fd)
            except OSError as exc:
                # nothing indexed, nothing acknowledged: cut the partial (or unsynced) records off
                self._cut_back()
                self._failed(exc)
                raise NotWritableError(self.data_dir, exc) from exc
            if not (self.flush_mode == "sync" and not defer_sync):
                self._log_dirty = True
            if not self.writable:
                self._writable_again()
            offset = self._size
            for new, record in zip(stored, chunks, strict=True):
                key = (new.topic, new.queue_id)
                queue = self._queues.get(key)
                if queue is None:
                    queue = self._queues[key] = array("q")
                    self._sizes[key] = array("i")
                queue.append(offset)
                self._sizes[key].append(len(record))
                offset += len(record)
                self._remember(new)
            self._size = offset
        for new in stored:
            self._notify(new)
        return stored

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(self._fd, view[written:])

    def _cut_back(self) -> None:
        """Never leave a half record in the log: truncate to the end of the last complete one."""
        try:
            os.ftruncate(self._fd, self._size)
            self._tail_dirty = False
        except OSError as exc:
            self._tail_dirty = (
                True  # O_APPEND would write after the garbage: cut before the next write
            )
            log.error(
                "commit log %s: cannot cut a failed append back to %d: %s",
                self._log_path,
                self._size,
                exc,
            )

    def _repair_tail(self) -> None:
        if self._tail_dirty:
            os.ftruncate(self._fd, self._size)
            self._tail_dirty = False

    def _failed(self, exc: OSError) -> None:
        first = self.writable
        self.writable = False
        self.write_failures = 1 if first else self.write_failures + 1
        if first:
            log.error("commit log %s is not writable: %s", self._log_path, exc)
        self._tell(False, exc)

    def _writable_again(self) -> None:
        self.writable = True
        log.info(
            "commit log %s is writable again after %d refused puts",
            self._log_path,
            self.write_failures,
        )
        self._tell(True, None)
        self.write_failures = 0

    def _tell(self, writable: bool, exc: OSError | None) -> None:
        listener = self.on_writable_change
        if listener is not None:
            try:
                listener(writable, exc)
            except Exception:  # a broken listener must not turn a refused put into a crash
                log.exception("writable listener %r failed", listener)

    def disk_util(self) -> str:
        """4.9.8's ``diskUtil()`` for this store: ``CL: 0.97 CQ: 0.97 INDEX: 0.97`` (one data dir here)."""
        ratio = disk_used_ratio(self.data_dir)
        return f"CL: {ratio:5.2f} CQ: {ratio:5.2f} INDEX: {ratio:5.2f}"

    def _notify(self, msg: StoredMessage) -> None:
        for listener in list(self.listeners):
            try:
                listener(msg)
            except Exception:  # a broken listener must not fail the producer's send
                log.exception("put listener %r failed", listener)

    def _remember(self, msg: StoredMessage) -> None:
        cache = self._cache
        cache[msg.commit_log_offset] = msg
        if len(cache) > _CACHE_LIMIT:
            for _ in range(len(cache) // 4):
                cache.pop(next(iter(cache)))

    # ------------------------------------------------------------------------------------------
    # reading
    def min_offset(self, topic: str, queue_id: int) -> int:
        return 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (= number of entries)."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            return len(queue) if queue is not None else 0

    def queue_ids(self, topic: str) -> list[int]:
        with self._lock:
            return sorted(qid for (t, qid) in self._queues if t == topic)

    def topics(self) -> set[str]:
        with self._lock:
            return {t for (t, _q) in self._queues}

    def get(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[StoredMessage]:
        """Up to ``max_count`` messages of one queue starting at ``offset`` (empty when out of range)."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None or offset < 0 or offset >= len(queue) or max_count <= 0:
                return []
            sizes = self._sizes[(topic, queue_id)]
            end = min(len(queue), offset + max_count)
            return [self._load(queue[i], sizes[i]) for i in range(offset, end)]

    def get_raw(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[bytes]:
        """Like ``get`` but returns the stored records; their concatenation is a valid PULL body."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None or offset < 0 or offset >= len(queue) or max_count <= 0:
                return []
            sizes = self._sizes[(topic, queue_id)]
            end = min(len(queue), offset + max_count)
            return [os.pread(self._fd, sizes[i], queue[i]) for i in range(offset, end)]

    def lookup(self, commit_log_offset: int) -> StoredMessage | None:
        """The message stored at a commit-log offset, or None if no record starts there."""
        with self._lock:
            cached = self._cache.get(commit_log_offset)
            if cached is not None:
                return cached
            if not 0 <= commit_log_offset <= self._size - FIXED_SIZE:
                return None
            head = os.pread(self._fd, 8, commit_log_offset)
            total = int.from_bytes(head[:4], "big", signed=True)
            magic = int.from_bytes(head[4:8], "big")
            if magic != MAGIC or total < FIXED_SIZE or commit_log_offset + total > self._size:
                return None
            try:
                msg = self._load(commit_log_offset, total)
            except ValueError:
                return None
            if msg.commit_log_offset != commit_log_offset:
                return None
            return msg

    def _load(self, offset: int, size: int) -> StoredMessage:
        cached = self._cache.get(offset)
        if cached is not None:
            return cached
        data = os.pread(self._fd, size, offset)
        msg, _ = decode_message(data)
        return msg

    # ------------------------------------------------------------------------------------------
    # consumer offsets
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            table = self._offsets.setdefault(f"{topic}@{group}", {})
            if table.get(str(queue_id)) == offset:
                return
            table[str(queue_id)] = int(offset)
            self._offsets_dirty = True
            if self.flush_mode == "sync":
                self._try_write_offsets()

    def _try_write_offsets(self) -> None:
        """Persist offsets; on a full disk keep them in memory (dirty) and retry at the next flush -
        a consumer's offset commit is still served, a crash meanwhile only re-delivers."""
        try:
            self._write_offsets()
        except OSError as exc:
            self._offsets_path.with_suffix(".tmp").unlink(missing_ok=True)
            if self._offsets_write_error is None:
                log.error(
                    "cannot persist consumer offsets to %s (kept in memory): %s",
                    self._offsets_path,
                    exc,
                )
            self._offsets_write_error = exc
        else:
            self._offsets_write_error = None

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        with self._lock:
            table = self._offsets.get(f"{topic}@{group}")
            if table is None:
                return None
            return table.get(str(queue_id))

    def _write_offsets(self) -> None:
        payload = json.dumps({"offsetTable": self._offsets}, sort_keys=True).encode()
        tmp = self._offsets_path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._offsets_path)
        self._offsets_dirty = False

    def _load_offsets(self) -> None:
        for path in (self._offsets_path, self._offsets_path.with_suffix(".tmp")):
            if not path.exists():
                continue
            try:
                data = json.loads(path.read_text())
                table = data.get("offsetTable", {})
                self._offsets = {
                    str(k): {str(q): int(o) for q, o in v.items()} for k, v in table.items()
                }
                return
            except (ValueError, AttributeError, TypeError):
                log.warning("ignoring unreadable consumer offset file %s", path)

    # ------------------------------------------------------------------------------------------
    # lifecycle
    def recover(self) -> None:
        """Rebuild consume queues from the commit log; cut off a torn or corrupt tail."""
        with self._lock:
            self._queues.clear()
            self._sizes.clear()
            self._cache.clear()
            file_size = os.fstat(self._fd).st_size
            pos = 0
            buf = b""
            buf_start = 0
            good_end = 0
            while pos < file_size:
                rel = pos - buf_start
                if len(buf) - rel < FIXED_SIZE + 4:
                    buf = buf[rel:] + os.pread(self._fd, _RECOVER_CHUNK, buf_start + len(buf))
                    buf_start = pos
                    rel = 0
                    if len(buf) < FIXED_SIZE + 4:
                        break
                total = int.from_bytes(buf[rel : rel + 4], "big", signed=True)
                magic = int.from_bytes(buf[rel + 4 : rel + 8], "big")
                if magic != MAGIC or total < FIXED_SIZE + 7 or pos + total > file_size:
                    break
                if len(buf) - rel < total:
                    buf = buf[rel:] + os.pread(
                        self._fd, max(_RECOVER_CHUNK, total), buf_start + len(buf)
                    )
                    buf_start = pos
                    rel = 0
                    if len(buf) < total:
                        break
                record = buf[rel : rel + total]
                if not self._index_record(record, pos):
                    break
                pos += total
                good_end = pos
            if good_end < file_size:
                log.warning(
                    "commit log %s: dropping %d bytes of torn/corrupt tail at offset %d",
                    self._log_path,
                    file_size - good_end,
                    good_end,
                )
                os.ftruncate(self._fd, good_end)
                os.fsync(self._fd)
            self._size = good_end
            self._load_offsets()

    def _index_record(self, record: bytes, pos: int) -> bool:
        try:
            body_len = int.from_bytes(record[FIXED_SIZE : FIXED_SIZE + 4], "big", signed=True)
            crc = int.from_bytes(record[8:12], "big", signed=True)
            body_start = FIXED_SIZE + 4
            if body_len < 0 or body_start + body_len + 3 > len(record):
                return False
            if zlib.crc32(record[body_start : body_start + body_len]) & 0x7FFFFFFF != crc:
                return False
            tpos = body_start + body_len
            topic_len = record[tpos]
            topic = record[tpos + 1 : tpos + 1 + topic_len].decode("utf-8", "replace")
            ppos = tpos + 1 + topic_len
            prop_len = int.from_bytes(record[ppos : ppos + 2], "big", signed=True)
            if ppos + 2 + prop_len != len(record):
                return False
            phys = int.from_bytes(record[28:36], "big", signed=True)
            if phys != pos:
                return False
            queue_id = int.from_bytes(record[12:16], "big", signed=True)
        except IndexError:
            return False
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = array("q")
            self._sizes[key] = array("i")
        queue.append(pos)
        self._sizes[key].append(len(record))
        return True

    def sync(self) -> None:
        """fdatasync the commit log now (blocking; safe to call from a worker thread)."""
        with self._lock:
            if self._closed:
                return
            self._log_dirty = False
            fd = self._fd
        try:
            os.fdatasync(fd)
        except OSError as exc:
            # the records are written and indexed but may not be on disk: refuse their acknowledgement
            with self._lock:
                self._failed(exc)
            raise NotWritableError(self.data_dir, exc) from exc

    def flush(self) -> None:
        """fsync the commit log and persist consumer offsets if anything changed."""
        with self._lock:
            if self._closed:
                return
            log_dirty, self._log_dirty = self._log_dirty, False
            if self._offsets_dirty:
                self._try_write_offsets()
            fd = self._fd
        if log_dirty:
            os.fdatasync(fd)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.flush()
            self._closed = True
            os.close(self._fd)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("message store is closed")

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
