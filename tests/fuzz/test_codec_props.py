"""Property tests of the embedded broker's decoders: any byte string either decodes or raises the
module's documented error, and whatever we encode decodes back to the same thing.

These are the in-suite budget; a longer run is the same properties with a larger
``--hypothesis-seed``/``max_examples`` (``TXMSG_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from txmsg_broker.codec import DecodeError, RemotingCommand
from txmsg_broker.message_codec import (
    MessageDecodeError,
    decode_batch,
    decode_messages,
    properties_to_string,
    string_to_properties,
)

EXAMPLES = int(os.environ.get("TXMSG_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Property keys/values exclude the two separators RocketMQ reserves (\x01 between key and value,
# \x02 between pairs); the client never sends them inside a key or value.
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)
ext_values = st.dictionaries(prop_text, st.text(max_size=30), max_size=6)


@FUZZ
@given(st.binary(max_size=512))
def test_frame_decoder_never_raises_anything_but_decode_error(payload: bytes) -> None:
    try:
        cmd = RemotingCommand.decode(payload)
    except DecodeError:
        return
    assert isinstance(cmd.code, int)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in cmd.ext_fields.items())


@FUZZ
@given(
    code=st.integers(-(2**31), 2**31 - 1),
    opaque=st.integers(0, 2**31 - 1),
    flag=st.sampled_from([0, 1, 2, 3]),
    remark=st.one_of(st.none(), st.text(max_size=40)),
    ext=ext_values,
    body=st.binary(max_size=256),
)
def test_frame_round_trip(
    code: int, opaque: int, flag: int, remark: str | None, ext: dict[str, str], body: bytes
) -> None:
    cmd = RemotingCommand(
        code=code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext, body=body
    )
    frame = cmd.encode()
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    back = RemotingCommand.decode(frame[4:])
    assert (back.code, back.opaque, back.flag, back.remark, back.ext_fields, back.body) == (
        code,
        opaque,
        flag,
        remark,
        ext,
        body,
    )


@FUZZ
@given(st.binary(max_size=400))
def test_message_decoders_raise_only_their_error(data: bytes) -> None:
    for decoder in (decode_messages, decode_batch):
        with contextlib.suppress(MessageDecodeError, ValueError):
            decoder(data)


@FUZZ
@given(st.dictionaries(prop_text, prop_text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert string_to_properties(properties_to_string(props)) == props


@FUZZ
@given(st.text(max_size=200))
def test_property_parser_accepts_any_text(text: str) -> None:
    parsed = string_to_properties(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.items())
