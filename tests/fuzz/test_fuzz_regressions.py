"""Inputs found by ``python -m benchmarks.fuzz_broker`` that raised undocumented exceptions, run in process
through the same checks as the long mode (``txmsg_broker.fuzz.inputs.run_target``)."""

from __future__ import annotations

import pytest
from txmsg_broker.codec import RemotingCommand
from txmsg_broker.fuzz.inputs import run_target
from txmsg_broker.message_codec import StoredMessage, encode_message


def payload(header: str) -> bytes:
    """A frame without its length word, as ``RemotingCommand.decode`` takes it."""
    raw = header.encode()
    return len(raw).to_bytes(4, "big") + raw


FRAME_CASES = {
    # int("--5") / int("\u00b2") raised ValueError: "code" passes str.isdigit() after lstrip("-")
    "code --5": payload('{"code":"--5"}'),
    "code superscript two": payload('{"code":"\\u00b2"}'),
    "code of 4400 digits": payload('{"code":"' + "9" * 4400 + '"}'),
    # json raised ValueError (not JSONDecodeError) for a number literal over int()'s 4300-digit limit
    "5000-digit opaque literal": payload('{"code":105,"opaque":' + "1" * 5000 + "}"),
    # json.dumps of an extFields value raised RecursionError just below the parser's own limit
    **{
        f"extFields nested {depth} deep": payload(
            '{"code":30,"extFields":{"a":' + "[" * depth + "]" * depth + "}}"
        )
        for depth in range(980, 1001)
    },
}


@pytest.mark.parametrize("case", sorted(FRAME_CASES))
@pytest.mark.parametrize("target", ["frame", "stream"])
def test_decoder_raises_only_decode_error(case: str, target: str) -> None:
    data = FRAME_CASES[case]
    if target == "stream":  # the server's framing loop: same payload with its length word
        data = len(data).to_bytes(4, "big") + data
    assert run_target(target, data) in ("ok", "DecodeError")


@pytest.mark.parametrize(
    "raw", ["1e400", "-1e400", "inf", "-Infinity", "nan", "1.5", "--5", "9" * 4400]
)
def test_ext_int_raises_value_error_for_non_integers(raw: str) -> None:
    # float("1e400") is inf, and int(inf) raised OverflowError -> "internal error" answers
    cmd = RemotingCommand.request(30, {"queueId": raw})
    with pytest.raises(ValueError, match="must be an integer"):
        cmd.ext_int("queueId")


@pytest.mark.parametrize(
    "field", ["flag", "sys_flag", "reconsume_times", "born_timestamp", "queue_offset"]
)
def test_encode_message_raises_value_error_for_out_of_range_fields(field: str) -> None:
    # a send header's flag of "-1e+308" became a 309-digit int and struct.error escaped the store
    msg = StoredMessage(topic="T", queue_id=0, body=b"x", **{field: -(10**308)})
    with pytest.raises(ValueError, match="out of range"):
        encode_message(msg)
