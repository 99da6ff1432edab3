"""Loading librocketmq through rocketmq-client-python's ``ffi`` and typing the C calls we use.

Why a module of its own:

* librocketmq reads ``ROCKETMQ_CLIENT_LOG_DIR`` when it sets its logger up, so the variable has
  to be in the environment *before* ``rocketmq.ffi`` loads the library; :func:`load` is the only
  place that imports the wrapper.
* The wrapper leaves several C functions untyped (``GetOrigin*`` for the message handed to the
  local-transaction callback, ``ShowProducerVersion``...).  Untyped ctypes calls truncate
  pointers to ``int``, so every function this plugin calls gets explicit argtypes/restype here.
* ``MQClientManager`` in librocketmq keeps its client-factory table in an unlocked ``std::map``;
  creating, starting and shutting down clients from several Python threads at once would race
  on it.  :data:`NATIVE_LOCK` serialises those calls (sends and callbacks do not take it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .settings import PULL_THREADS

LIB_SHA256_2_1_0 = "ed3fce39f2b926637637a2b8b9122799f207b0cdf98dbd9110505bf43170fa30"
"""sha256 of the ``librocketmq.so`` built from rocketmq-client-cpp 2.1.0 (see docs/rocketmq-facts.md).
2.0.0 silently drops every transaction check-back, so the doctor insists on this hash."""

LOG_DIR_ENV = "ROCKETMQ_CLIENT_LOG_DIR"

NATIVE_LOCK = threading.RLock()
"""Serialises client create/start/shutdown/destroy calls (librocketmq's factory table is unlocked)."""

# C API status / enum values (CCommon.h, CTransactionStatus.h, CSendResult.h, CPushConsumer.h).
OK = 0
E_COMMIT_TRANSACTION = 0
E_ROLLBACK_TRANSACTION = 1
E_UNKNOWN_TRANSACTION = 2
E_CONSUME_SUCCESS = 0
E_RECONSUME_LATER = 1
SEND_STATUS_NAMES = {
    0: "SEND_OK",
    1: "FLUSH_DISK_TIMEOUT",
    2: "FLUSH_SLAVE_TIMEOUT",
    3: "SLAVE_NOT_AVAILABLE",
}


# ctypes caches CFUNCTYPE classes by signature, so these are the very classes the wrapper's ffi
# declares; its own TransactionMQProducer keeps working next to ours (the benchmarks use it).
CHECK_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
"""``CLocalTransactionCheckerCallback(CProducer*, CMessageExt*, void* userData)``."""

EXECUTE_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
"""``CLocalTransactionExecutorCallback(CProducer*, CMessage*, void* userData)``."""

MESSAGE_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
"""``MessageCallBack(CPushConsumer*, CMessageExt*)``."""

MAX_MESSAGE_ID_LENGTH = 256
"""CCommon.h of librocketmq 2.1.0."""


class CSendResult(ctypes.Structure):
    """``CSendResult`` (CSendResult.h): the same layout as the wrapper's ``_CSendResult``.

    Declared here because the asynchronous callbacks receive it *by value*; the wrapper's
    ``SEND_SUCCESS_CALLBACK`` takes a pointer, which reads the struct's first bytes as an address.
    """

    _fields_ = [
        ("sendStatus", ctypes.c_int),
        ("msgId", ctypes.c_char * MAX_MESSAGE_ID_LENGTH),
        ("offset", ctypes.c_longlong),
    ]


class CMQException(ctypes.Structure):
    """``CMQException`` (CMQException.h of 2.1.0: file 256, msg 512, type 128 bytes).

    The wrapper's ``_CMQException`` declares 512/512/512, which is not what the library passes;
    a callback typed with it would read past the argument.  ``type`` is never filled by 2.1.0's
    callbacks (uninitialised stack memory): read ``msg`` and ``error`` only.
    """

    _fields_ = [
        ("error", ctypes.c_int),
        ("line", ctypes.c_int),
        ("file", ctypes.c_char * 256),
        ("msg", ctypes.c_char * 512),
        ("type", ctypes.c_char * 128),
    ]


QUEUE_SELECTOR_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p
)
"""``QueueSelectorCallback(int size, CMessage* msg, void* arg)``: returns the index of the queue in
the topic's write-queue list; called in the sending thread, inside the send call."""

ON_SEND_SUCCESS = ctypes.CFUNCTYPE(None, CSendResult, ctypes.c_void_p, ctypes.c_void_p)
"""``COnSendSuccessCallback(CSendResult result, CMessage* msg, void* userData)`` (``SendAsync``)."""

ON_SEND_EXCEPTION = ctypes.CFUNCTYPE(None, CMQException, ctypes.c_void_p, ctypes.c_void_p)
"""``COnSendExceptionCallback(CMQException e, CMessage* msg, void* userData)`` (``SendAsync``)."""

SEND_SUCCESS = ctypes.CFUNCTYPE(None, CSendResult)
"""``CSendSuccessCallback(CSendResult result)`` (``SendMessageOrderlyAsync``: no user data)."""

SEND_EXCEPTION = ctypes.CFUNCTYPE(None, CMQException)
"""``CSendExceptionCallback(CMQException e)`` (``SendMessageOrderlyAsync``)."""


@dataclass(frozen=True)
class Native:
    """The loaded library plus where it came from."""

    dll: Any  # ctypes.CDLL; typed Any because every attribute is a dynamically typed C function
    path: Path
    wrapper: ModuleType  # the rocketmq.ffi module

    def new_send_result(self) -> Any:
        """A zeroed ``CSendResult`` of the wrapper's own struct type (argtypes must match)."""
        return self.wrapper._CSendResult()

    def last_error(self) -> str:
        """librocketmq's last error text (thread-global in the library; best effort)."""
        try:
            raw = self.dll.GetLatestErrorMessage()
        except Exception:  # noqa: BLE001 - diagnostics only
            return ""
        return raw.decode("utf-8", "replace") if raw else ""


_native: Native | None = None
_load_lock = threading.Lock()


def configure_log_dir(log_dir: str | os.PathLike[str] | None) -> Path | None:
    """Create ``log_dir`` and export it as ``ROCKETMQ_CLIENT_LOG_DIR`` (unless already set).

    An explicit environment variable wins, so operators can redirect logs without touching the
    application's configuration.  Returns the directory in effect, if any.
    """
    current = os.environ.get(LOG_DIR_ENV)
    if current:
        path = Path(current)
    elif log_dir is not None and str(log_dir):
        path = Path(log_dir).expanduser().resolve()
        os.environ[LOG_DIR_ENV] = str(path)
    else:
        return None
    path.mkdir(parents=True, exist_ok=True)
    return path


CLIENT_DIST = "rocketmq-client-python"
INSTALL_HINT = "pip install 'txmsg[rocketmq]'"


def client_installed() -> bool:
    """Whether ``rocketmq-client-python`` (an optional dependency, extra ``rocketmq``) is installed."""
    try:
        importlib.metadata.version(CLIENT_DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_client_message(exc: BaseException) -> str:
    """What to do when ``rocketmq.ffi`` does not import: the wrapper is an optional dependency
    (``txmsg[rocketmq]``), so an install for the rocketmq5 backend alone does not have it."""
    if isinstance(exc, ModuleNotFoundError) or not client_installed():
        return (
            f"the rocketmq backend needs {CLIENT_DIST} 2.0.0 and librocketmq 2.1.0 "
            f"(Linux x86-64), which are not installed ({exc}): `{INSTALL_HINT}`, then "
            "`txmsg install-librocketmq` for librocketmq; "
            'or use backend = "rocketmq5" (the pure-Python 5.x client, any platform)'
        )
    return (
        f"cannot load librocketmq through {CLIENT_DIST}: {exc}. Run "
        "`txmsg install-librocketmq` to put librocketmq 2.1.0 in place, then `txmsg doctor`."
    )


def load(log_dir: str | os.PathLike[str] | None = None) -> Native:
    """Import ``rocketmq.ffi`` (loading librocketmq) after setting up its log directory.

    Raises :class:`ImportError` with the fix when the wrapper or the library is missing.
    """
    global _native
    with _load_lock:
        if _native is not None:
            return _native
        configure_log_dir(log_dir)
        try:
            import rocketmq.ffi as ffi  # noqa: PLC0415 - must happen after the env var is set
        except ImportError as exc:
            raise ImportError(missing_client_message(exc)) from exc
        path = Path(getattr(ffi, "_DYLIB_PATH", "") or "")
        _declare(ffi.dll)
        _native = Native(dll=ffi.dll, path=path, wrapper=ffi)
        return _native


TRACE_OPEN = 0
TRACE_CLOSE = 1


def start_push_consumer(native: Native, handle: int) -> int:
    """Start a push consumer so that shutting it down later does not segfault.

    librocketmq 2.1.0's ``DefaultMQPushConsumerImpl::shutdown`` calls
    ``m_DefaultMQProducerImpl->shutdown(false)`` on the message-trace producer without checking
    it exists (fixed upstream in 2.2.0, apache/rocketmq-client-cpp#286); with tracing off (the
    default) that pointer is null and every ``ShutdownPushConsumer`` crashes the process.  So we
    switch tracing on for ``start()`` (which creates that inner producer) and off right after
    (so no trace message is ever sent: the consume hooks check the flag).  Side effect: the
    consumer's heartbeat also lists a producer group named like the consumer group.
    Call with :data:`NATIVE_LOCK` held.
    """
    dll = native.dll
    dll.SetPushConsumerMessageTrace(handle, TRACE_OPEN)
    status = int(dll.StartPushConsumer(handle))
    dll.SetPushConsumerMessageTrace(handle, TRACE_CLOSE)
    return status


_NEVER_STARTED: list[tuple[int, object]] = []
"""Push consumers that never reached RUNNING (with their callback objects): parked for the life of
the process, never destroyed."""


def release_push_consumer(
    native: Native, handle: int, *, started: bool, keep: object = None
) -> None:
    """Shut a push consumer down and destroy it - unless it never started.

    Why: librocketmq 2.1.0's ``DefaultMQPushConsumerImpl`` starts its timer thread (an
    ``io_service::run`` loop) in the *constructor*, and only ``shutdown()`` of a RUNNING consumer
    stops and joins it.  ``DestroyPushConsumer`` on a consumer that was created but never started
    (or whose ``start`` failed) frees the io_service while that thread still waits on it: the
    thread then writes into freed heap (valgrind: "Invalid write ... scheduler::run", freed by
    ``~DefaultMQPushConsumerImpl``) or the destructor blocks for ever in ``pthread_cond_destroy``.
    The freed memory belongs to whatever the process allocates next - once it was SQLite's page
    cache ("malformed database schema" in a fresh database).  So a consumer that did not start is
    parked here instead (one idle thread and a few KB until the process exits), together with
    ``keep`` - the ctypes callback it was given, which a half-started consumer may still call.
    Call with :data:`NATIVE_LOCK` held.
    """
    dll = native.dll
    if started:
        dll.ShutdownPushConsumer(handle)
        dll.DestroyPushConsumer(handle)
    else:
        _NEVER_STARTED.append((handle, keep))


SYNC_PULL_SYMBOL = "_ZN8rocketmq21DefaultMQPushConsumer12setAsyncPullEb"
PULL_THREADS_SYMBOL = "_ZN8rocketmq21DefaultMQPushConsumer25setPullMsgThreadPoolCountEi"
"""Default pull threads per push consumer (config key ``pull_threads``).  With synchronous pulls
one pull per queue (the topic's queues on every broker plus the retry queue) runs at a time on
each, so keep it at least that; asynchronous pulls only issue requests on them."""


def set_pull(native: Native, handle: int, *, sync: bool, threads: int = PULL_THREADS) -> bool:
    """Set a push consumer's pull threads and (``sync``) switch it to synchronous pulls, before
    ``start``.  Returns False (nothing set) if the library lacks the symbols.

    Why a consumer may want synchronous pulls: librocketmq 2.1.0's asynchronous pull (its
    default) keeps one ``AsyncPullCallback`` per queue and only points it at a new
    ``PullRequest`` once the previous request object has been freed (``getAsyncPullCallBack``;
    fixed upstream after 2.2.0).  When a rebalance drops a queue and takes it back while the old
    request is still referenced - a pull that failed because the broker went away is retried 1 s
    later, and the rebalance itself holds a copy of the table - the new request's pull result is
    judged against the old, dropped request and the queue is never pulled again by that process
    ("has been set as dropped. Will NOT pull this queue any more" in the client log).  The
    synchronous path has no shared callback, but it never asks the broker to hold a pull, so an
    idle queue is pulled back to back (a core per idle consumer).  txmsg's consumers pull
    asynchronously and restart a consumer whose queue stalled (``txmsg_rocketmq.pull_watch``);
    ``sync_pull = true`` takes the synchronous path instead (docs/librocketmq-hazards.md #5).
    The C API has no setter, but ``CPushConsumer*`` *is* a ``DefaultMQPushConsumer*``
    (``CreatePushConsumer`` casts it), so the exported C++ setters are called on the handle.
    """
    dll = native.dll
    try:
        set_async = getattr(dll, SYNC_PULL_SYMBOL)
        set_threads = getattr(dll, PULL_THREADS_SYMBOL)
    except AttributeError:
        return False
    set_async.argtypes, set_async.restype = [ctypes.c_void_p, ctypes.c_bool], None
    set_threads.argtypes, set_threads.restype = [ctypes.c_void_p, ctypes.c_int], None
    set_threads(handle, int(threads))
    set_async(handle, not sync)
    return True


CONSUME_FROM_SYMBOL = (
    "_ZN8rocketmq21DefaultMQPushConsumer19setConsumeFromWhereENS_16ConsumeFromWhereE"
)
CONSUME_FROM = {"last": 0, "first": 4}
"""txmsg's names -> librocketmq's ``ConsumeFromWhere`` (CONSUME_FROM_LAST_OFFSET = 0,
CONSUME_FROM_FIRST_OFFSET = 4 in include/ConsumeType.h)."""


def set_consume_from(native: Native, handle: int, where: int) -> bool:
    """``DefaultMQPushConsumer::setConsumeFromWhere`` on a push consumer before ``start``.

    Why txmsg defaults to FIRST: librocketmq 2.1.0 turns a *timed-out* offset query (a request
    sent on a connection to a broker that just died; the client notices only after 5 s) into
    "this group has no offset" (``readOffset`` returns -1 for any ``MQBrokerException``, and a
    null response is one), and CONSUME_FROM_LAST_OFFSET then starts the queue at its end: every
    message between the committed offset and the end is skipped for good.  The chaos run lost 4
    paid orders this way (docs/librocketmq-hazards.md #6).  With FIRST the same mistake replays
    from the queue's head instead, and idempotent consumers absorb the duplicates.  The C API has
    no setter; the handle is the C++ object (see :func:`set_pull`).
    """
    try:
        setter = getattr(native.dll, CONSUME_FROM_SYMBOL)
    except AttributeError:
        return False
    setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_int], None
    setter(handle, int(where))
    return True


def library_path() -> Path | None:
    """Where the wrapper will load librocketmq from, without loading it (for the doctor)."""
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    packaged = folder / ("librocketmq.dylib" if sys.platform == "darwin" else "librocketmq.so")
    if packaged.exists():
        return packaged
    found = ctypes.util.find_library("rocketmq")
    return Path(found) if found else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_c_void_p, _c_char_p, _c_int = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    # messages
    "CreateMessage": ([_c_char_p], _c_void_p),
    "DestroyMessage": ([_c_void_p], _c_int),
    "SetMessageKeys": ([_c_void_p, _c_char_p], _c_int),
    "SetMessageTags": ([_c_void_p, _c_char_p], _c_int),
    "SetByteMessageBody": ([_c_void_p, _c_char_p, _c_int], _c_int),
    "SetMessageProperty": ([_c_void_p, _c_char_p, _c_char_p], _c_int),
    "GetOriginMessageTopic": ([_c_void_p], _c_char_p),
    "GetOriginMessageTags": ([_c_void_p], _c_char_p),
    "GetOriginMessageKeys": ([_c_void_p], _c_char_p),
    "GetOriginMessageBody": ([_c_void_p], _c_char_p),
    "GetOriginMessageProperty": ([_c_void_p, _c_char_p], _c_char_p),
    "GetMessageTopic": ([_c_void_p], _c_char_p),
    "GetMessageTags": ([_c_void_p], _c_char_p),
    "GetMessageKeys": ([_c_void_p], _c_char_p),
    "GetMessageBody": ([_c_void_p], _c_char_p),
    "GetMessageProperty": ([_c_void_p, _c_char_p], _c_char_p),
    "GetMessageId": ([_c_void_p], _c_char_p),
    "GetMessageReconsumeTimes": ([_c_void_p], _c_int),
    "GetMessageQueueId": ([_c_void_p], _c_int),
    "GetMessageQueueOffset": ([_c_void_p], ctypes.c_longlong),
    "SetDelayTimeLevel": ([_c_void_p, _c_int], _c_int),
    "CreateBatchMessage": ([], _c_void_p),
    "AddMessage": ([_c_void_p, _c_void_p], _c_int),
    "DestroyBatchMessage": ([_c_void_p], _c_int),
    # producers
    "CreateProducer": ([_c_char_p], _c_void_p),
    "CreateTransactionProducer": ([_c_char_p, CHECK_CALLBACK, _c_void_p], _c_void_p),
    "DestroyProducer": ([_c_void_p], _c_int),
    "StartProducer": ([_c_void_p], _c_int),
    "ShutdownProducer": ([_c_void_p], _c_int),
    "SetProducerNameServerAddress": ([_c_void_p, _c_char_p], _c_int),
    "SetProducerInstanceName": ([_c_void_p, _c_char_p], _c_int),
    "SetProducerSendMsgTimeout": ([_c_void_p, _c_int], _c_int),
    "SetProducerSessionCredentials": ([_c_void_p, _c_char_p, _c_char_p, _c_char_p], _c_int),
    "SetProducerMaxMessageSize": ([_c_void_p, _c_int], _c_int),
    "SendMessageOneway": ([_c_void_p, _c_void_p], _c_int),
    "SendBatchMessage": ([_c_void_p, _c_void_p, _c_void_p], _c_int),
    "ShowProducerVersion": ([_c_void_p], _c_char_p),
    # push consumers
    "CreatePushConsumer": ([_c_char_p], _c_void_p),
    "DestroyPushConsumer": ([_c_void_p], _c_int),
    "StartPushConsumer": ([_c_void_p], _c_int),
    "ShutdownPushConsumer": ([_c_void_p], _c_int),
    "SetPushConsumerNameServerAddress": ([_c_void_p, _c_char_p], _c_int),
    "SetPushConsumerInstanceName": ([_c_void_p, _c_char_p], _c_int),
    "SetPushConsumerThreadCount": ([_c_void_p, _c_int], _c_int),
    "SetPushConsumerMessageBatchMaxSize": ([_c_void_p, _c_int], _c_int),
    "SetPushConsumerSessionCredentials": ([_c_void_p, _c_char_p, _c_char_p, _c_char_p], _c_int),
    "SetPushConsumerMessageTrace": ([_c_void_p, _c_int], _c_int),
    "Subscribe": ([_c_void_p, _c_char_p, _c_char_p], _c_int),
    "RegisterMessageCallback": ([_c_void_p, MESSAGE_CALLBACK], _c_int),
    "RegisterMessageCallbackOrderly": ([_c_void_p, MESSAGE_CALLBACK], _c_int),
    "UnregisterMessageCallback": ([_c_void_p], _c_int),
    "GetLatestErrorMessage": ([], _c_char_p),
}
"""Every C function txmsg calls, with its exact signature (kept where the wrapper declares one:
its classes pass their own struct types and check statuses against its enum)."""

# The wrapper does not declare these (SendMessageOrderly) or declares their callbacks with the
# wrong types (SendAsync/SendMessageOrderlyAsync take CSendResult by value); nothing in the
# wrapper calls them, so our signatures replace any it has.
_OWN_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "SendAsync": ([_c_void_p, _c_void_p, ON_SEND_SUCCESS, ON_SEND_EXCEPTION, _c_void_p], _c_int),
    "SendMessageOrderly": (
        [
            _c_void_p,
            _c_void_p,
            QUEUE_SELECTOR_CALLBACK,
            _c_void_p,
            _c_int,
            ctypes.POINTER(CSendResult),
        ],
        _c_int,
    ),
    "SendMessageOrderlyAsync": (
        [_c_void_p, _c_void_p, QUEUE_SELECTOR_CALLBACK, _c_void_p, SEND_SUCCESS, SEND_EXCEPTION],
        _c_int,
    ),
    "SendMessageOnewayOrderly": (
        [_c_void_p, _c_void_p, QUEUE_SELECTOR_CALLBACK, _c_void_p],
        _c_int,
    ),
}


def _declare(dll: Any) -> None:
    """Give every C function we call an exact signature: :data:`_SIGNATURES` where the wrapper
    declares none, :data:`_OWN_SIGNATURES` always."""
    for name, (argtypes, restype) in _SIGNATURES.items():
        fn = getattr(dll, name)
        if fn.argtypes is None:
            fn.argtypes = argtypes
            fn.restype = restype
    for name, (argtypes, restype) in _OWN_SIGNATURES.items():
        fn = getattr(dll, name)
        fn.argtypes = argtypes
        fn.restype = restype
