"""Property tests against a LIVE broker: any bytes on either port get an answer or a closed connection,
never a hang, a crash or an internal error; a well-behaved client sending at the same time never fails,
and everything it stored reads back intact, before and after a restart.

Each example is one connection (``txmsg_broker.fuzz.live.exchange``): the input, then a probe request,
then a half-close. The in-suite budget is ``TXMSG_FUZZ_EXAMPLES`` (default 200); the long mode is
``python -m benchmarks.fuzz_broker`` (see plugins/txmsg-broker/README.md, "Fuzzing").
"""

from __future__ import annotations

import json
import os
import random
import struct

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from txmsg_broker.codec import MAX_FRAME_LENGTH, RemotingCommand
from txmsg_broker.fuzz.inputs import (
    CODES,
    EXT_KEYS,
    INTERESTING_STRINGS,
    RandomChooser,
    frame,
    frame_bytes,
)
from txmsg_broker.fuzz.live import (
    GoodSender,
    LogWatcher,
    exchange,
    healthy,
    log_findings,
    problems,
    read_back,
)
from txmsg_broker.message_codec import BatchItem, encode_batch
from txmsg_broker.testing import wait_until

EXAMPLES = int(os.environ.get("TXMSG_FUZZ_EXAMPLES", "200"))
LIVE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- strategies -----------------------------------------------------------------------------------
#: generic edge cases of integer parsing: signs, unicode digits, floats, infinities, over 4300 digits
NUMBER_EDGES = (
    "--5",
    "+5",
    " 7",
    "\u00b2",
    "\u0663",
    "1.5",
    "2.0",
    "1e400",
    "-1e400",
    "inf",
    "-inf",
    "nan",
    "Infinity",
    "2147483648",
    "-2147483649",
    "9223372036854775808",
    "9" * 4400,
    "",
    "0x10",
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(INTERESTING_STRINGS),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
ext_values = (
    st.sampled_from(NUMBER_EDGES)
    | st.sampled_from(INTERESTING_STRINGS)
    | st.integers().map(str)
    | st.text(max_size=20)
    | json_values
)
ext_dicts = st.dictionaries(st.sampled_from(EXT_KEYS) | st.text(max_size=8), ext_values, max_size=8)
headers = st.fixed_dictionaries(
    {"code": st.sampled_from(CODES) | st.sampled_from(NUMBER_EDGES) | st.integers() | json_values},
    optional={
        "opaque": st.integers(0, 2**31 - 1) | st.sampled_from(NUMBER_EDGES) | json_values,
        "flag": st.sampled_from([0, 1, 2, 3]) | json_values,
        "language": st.sampled_from(["JAVA", "CPP", "PYTHON"]) | json_values,
        "version": st.integers(-1, 400) | json_values,
        "remark": st.none() | st.text(max_size=30),
        "extFields": ext_dicts | json_values,
        "serializeTypeCurrentRPC": st.just("JSON"),
    },
)
batch_bodies = st.lists(
    st.builds(
        BatchItem,
        body=st.binary(max_size=50),
        flag=st.integers(0, 2**31 - 1),
        properties=st.dictionaries(
            st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "x"]),
            st.text("abc", min_size=1, max_size=5),
            max_size=3,
        ),
    ),
    min_size=1,
    max_size=3,
).map(encode_batch)
bodies = st.binary(max_size=300) | batch_bodies | json_values.map(lambda v: json.dumps(v).encode())


@st.composite
def json_header_frames(draw: st.DrawFn) -> bytes:
    """Valid length-prefixed frames with a JSON header (random code, ext fields, body)."""
    text = json.dumps(draw(headers), ensure_ascii=draw(st.booleans()))
    return frame_bytes(text.encode("utf-8", "surrogatepass"), draw(bodies))


@st.composite
def binary_header_frames(draw: st.DrawFn) -> bytes:
    """RocketMQ's binary header serialization (type 1): what a Java client configured for it sends."""
    remark = draw(st.binary(max_size=20))
    ext = b"".join(
        struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
        for k, v in draw(
            st.dictionaries(st.binary(min_size=1, max_size=10), st.binary(max_size=20), max_size=4)
        ).items()
    )
    header = struct.pack(
        ">hBhii",
        draw(st.sampled_from(CODES)) & 0x7FFF,
        draw(st.integers(0, 11)),
        396,
        draw(st.integers(0, 2**31 - 1)),
        draw(st.sampled_from([0, 2])),
    )
    header += struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext
    return frame_bytes(header, draw(bodies), type_byte=draw(st.sampled_from([1, 1, 0, 0xFF])))


garbage_header_frames = st.builds(
    frame_bytes, st.binary(max_size=300), st.binary(max_size=100), type_byte=st.integers(0, 255)
)
valid_frames = json_header_frames() | binary_header_frames()
truncated_frames = st.tuples(valid_frames, st.floats(0, 1, exclude_max=True)).map(
    lambda pair: pair[0][: int(len(pair[0]) * pair[1])]
)
huge_lengths = st.tuples(
    st.sampled_from([MAX_FRAME_LENGTH, MAX_FRAME_LENGTH + 1, 2**31, 2**32 - 1])
    | st.integers(0, 2**32 - 1),
    st.binary(max_size=64),
).map(lambda pair: struct.pack(">I", pair[0]) + pair[1])
#: the long mode's own generators (mutated codec encodings), driven by a hypothesis-controlled Random
mutated_frames = st.randoms(use_true_random=False).map(lambda rng: frame(RandomChooser(rng)))
json_frames = json_header_frames()
# one_of draws its branches uniformly: JSON-header frames (what reaches the handlers) get three shares
single_inputs = (
    json_frames
    | json_frames
    | json_frames
    | binary_header_frames()
    | st.binary(max_size=1024)
    | garbage_header_frames
    | truncated_frames
    | huge_lengths
    | mutated_frames
)
fuzz_inputs = single_inputs | st.lists(single_inputs, min_size=2, max_size=4).map(b"".join)
ports = st.sampled_from(["broker", "broker", "broker", "namesrv"])


# --- inputs that crashed or misbehaved before the fixes (see the README's "Fuzzing" section) ---------
def _json_frame(text: str, body: bytes = b"") -> bytes:
    return frame_bytes(text.encode(), body)


REGRESSIONS = {
    "code --5": _json_frame('{"code":"--5"}'),
    "code superscript two": _json_frame('{"code":"\\u00b2"}'),
    "5000-digit opaque literal": _json_frame('{"code":105,"opaque":' + "1" * 5000 + "}"),
    "extFields nested 993 deep": _json_frame(
        '{"code":30,"extFields":{"a":' + "[" * 993 + "]" * 993 + "}}"
    ),
    "queueId 1e400": RemotingCommand.request(30, {"topic": "TBW102", "queueId": "1e400"}).encode(),
    "suspendTimeoutMillis inf": RemotingCommand.request(
        11, {"topic": "TBW102", "queueId": 0, "queueOffset": 0, "suspendTimeoutMillis": "inf"}
    ).encode(),
    # a send whose flag / bornTimestamp does not fit the record's int32 / int64: struct.error
    "send flag -1e+308": RemotingCommand.request(
        310,
        {
            "a": "PG",
            "b": "FuzzT",
            "c": "TBW102",
            "d": 4,
            "e": 0,
            "f": 0,
            "g": 0,
            "h": "-1e+308",
            "i": "",
            "j": 0,
            "k": "false",
            "l": 16,
            "m": "false",
        },
        b"x",
    ).encode(),
    "send bornTimestamp 2**64": RemotingCommand.request(
        310,
        {
            "a": "PG",
            "b": "FuzzT",
            "c": "TBW102",
            "d": 4,
            "e": 0,
            "f": 0,
            "g": str(2**64),
            "h": 0,
            "i": "",
            "j": 0,
            "k": "false",
            "l": 16,
            "m": "false",
        },
        b"x",
    ).encode(),
    "heartbeat body nested 3000 deep": RemotingCommand.request(
        34, body=b"[" * 3000 + b"]" * 3000
    ).encode(),
    "lock body nested 3000 deep": RemotingCommand.request(
        41, body=b"[" * 3000 + b"]" * 3000
    ).encode(),
}


def _with_regressions(test):  # type: ignore[no-untyped-def]
    for data in REGRESSIONS.values():
        test = example(port="broker", data=data)(test)
    return example(port="namesrv", data=REGRESSIONS["code --5"])(test)


def test_live_broker_survives_fuzzed_connections(txmsg_broker):
    """No crash, no hang, the well-behaved client keeps working, stored data stays readable."""
    good = GoodSender(txmsg_broker.broker_addr)
    good.start()
    logs = LogWatcher(txmsg_broker.log_dir)
    try:
        wait_until(
            lambda: len(good.sent) > 0 or bool(good.failures),
            timeout=20,
            message="the first good send",
        )

        @LIVE
        @given(port=ports, data=fuzz_inputs)
        @_with_regressions
        def fuzz_one_connection(port: str, data: bytes) -> None:
            addr = txmsg_broker.namesrv_addr if port == "namesrv" else txmsg_broker.broker_addr
            result = exchange(addr, data, deadline=10.0)
            assert not problems(data, result), (problems(data, result), data.hex())
            assert not logs.new_findings(), data.hex()  # a traceback in the broker's logs
            assert not good.failures, good.failures

        fuzz_one_connection()
        wait_until(
            lambda: len(good.sent) >= 20,
            timeout=20,
            message="the well-behaved client to make progress",
        )
    finally:
        good.stop()
    assert not good.failures, good.failures
    assert good.attempts == len(good.sent)
    assert txmsg_broker.running, "the broker process died"
    assert not healthy(txmsg_broker.namesrv_addr, txmsg_broker.broker_addr)

    stored = read_back(txmsg_broker.broker_addr, good.topic)
    missing = {body for body, queue_id in good.sent.items() if stored.get(body) != queue_id}
    assert not missing, (
        f"{len(missing)} of {len(good.sent)} acknowledged messages not read back intact"
    )
    txmsg_broker.restart()  # the commit log is re-verified record by record on start
    stored = read_back(txmsg_broker.broker_addr, good.topic)
    assert all(stored.get(body) == queue_id for body, queue_id in good.sent.items())
    assert not log_findings(txmsg_broker.log_dir)


def test_regression_inputs_get_an_answer_or_a_closed_connection(txmsg_broker):
    """The inputs that used to escape as undocumented exceptions, one by one, with a clean log after."""
    for name, data in REGRESSIONS.items():
        result = exchange(txmsg_broker.broker_addr, data, deadline=10.0)
        assert not problems(data, result), (name, problems(data, result))
    # a deeply nested header at every depth around the interpreter's recursion limit
    rng = random.Random(5)
    for depth in range(960, 1010):
        opener, closer = rng.choice([("[", "]"), ('{"x":', "}")])
        data = _json_frame(
            '{"code":30,"extFields":{"a":' + opener * depth + "1" + closer * depth + "}}"
        )
        assert not problems(data, exchange(txmsg_broker.broker_addr, data, deadline=10.0)), depth
    assert not healthy(txmsg_broker.namesrv_addr, txmsg_broker.broker_addr)
    assert not log_findings(txmsg_broker.log_dir)
