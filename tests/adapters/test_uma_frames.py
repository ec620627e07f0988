"""The UMA frame codec: reassembly at any chunk boundary, the size cap, invalid payloads."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest

from worker_adapters.uma_frames import (
    E_PROTO_BAD_REQUEST,
    E_PROTO_FRAME_TOO_LARGE,
    E_PROTO_INVALID_JSON,
    FrameDecoder,
    FrameError,
    FrameStream,
    encode_frame,
)

FRAMES: list[dict[str, Any]] = [
    {"id": "r1", "prompt": "hello", "max_tokens": 4},
    {"id": "r1", "event": "token", "text": "nul \u0000 and é ✓ 🙂", "token_id": 7},
    {"id": "r1", "event": "eos", "reason": "stop", "nested": {"a": [1, 2.5, None, True]}},
]


def frame_of(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def decode_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[dict[str, Any]]:
    return [frame for chunk in chunks for frame in decoder.frames(chunk)]


def test_encode_is_little_endian_length_then_json() -> None:
    data = encode_frame({"id": "x", "text": "é"})
    (length,) = struct.unpack("<I", data[:4])
    assert length == len(data) - 4
    assert json.loads(data[4:].decode("utf-8")) == {"id": "x", "text": "é"}


def test_several_frames_in_one_chunk() -> None:
    data = b"".join(encode_frame(f) for f in FRAMES)
    decoder = FrameDecoder()
    assert decode_all(decoder, [data]) == FRAMES
    assert decoder.pending == 0


def test_split_at_every_byte_boundary() -> None:
    data = b"".join(encode_frame(f) for f in FRAMES)
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        assert decode_all(decoder, [data[:cut], data[cut:]]) == FRAMES, cut
        assert decoder.pending == 0


def test_split_at_every_pair_of_boundaries() -> None:
    data = b"".join(encode_frame(f) for f in FRAMES[:2])
    for a in range(len(data) + 1):
        for b in range(a, len(data) + 1):
            decoder = FrameDecoder()
            assert decode_all(decoder, [data[:a], data[a:b], data[b:]]) == FRAMES[:2], (a, b)


def test_one_byte_at_a_time_holds_partial_frames() -> None:
    data = encode_frame(FRAMES[0])
    decoder = FrameDecoder()
    for i in range(len(data) - 1):
        assert list(decoder.frames(data[i : i + 1])) == []
        assert decoder.pending == i + 1
    assert list(decoder.frames(data[-1:])) == [FRAMES[0]]
    assert decoder.pending == 0


def test_frame_at_the_cap_passes_and_one_byte_more_is_refused() -> None:
    payload = {"text": "x" * 20}
    size = len(encode_frame(payload)) - 4
    decoder = FrameDecoder(max_frame_bytes=size)
    assert list(decoder.frames(encode_frame(payload, max_frame_bytes=size))) == [payload]
    with pytest.raises(FrameError) as info:
        encode_frame({"text": "x" * 21}, max_frame_bytes=size)
    assert info.value.code == E_PROTO_FRAME_TOO_LARGE


def test_oversize_is_refused_from_the_header_alone() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.feed(struct.pack("<I", 1025))  # no payload byte has arrived
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert info.value.code == E_PROTO_FRAME_TOO_LARGE
    assert decoder.pending == 0


def test_after_oversize_the_decoder_refuses_everything() -> None:
    decoder = FrameDecoder(max_frame_bytes=16)
    with pytest.raises(FrameError):
        list(decoder.frames(struct.pack("<I", 2**32 - 1) + b"{}"))
    with pytest.raises(FrameError) as info:
        list(decoder.frames(encode_frame({})))
    assert info.value.code == E_PROTO_FRAME_TOO_LARGE


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b'{"a": }', b"{'a': 1}", b"NaN", b'{"a": 1} x', b'{"t": "\xff\xfe"}', b"\x00"],
    ids=repr,
)
def test_invalid_json_is_refused_and_the_stream_goes_on(payload: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of(payload) + encode_frame({"ok": 1}))
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert info.value.code == E_PROTO_INVALID_JSON
    assert decoder.next_frame() == {"ok": 1}


@pytest.mark.parametrize("payload", [b"[1, 2]", b'"text"', b"null", b"3", b"true"])
def test_json_that_is_not_an_object_is_a_bad_frame(payload: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of(payload))
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert info.value.code == E_PROTO_BAD_REQUEST


async def test_frame_stream_reads_across_chunks_and_reports_a_cut_frame() -> None:
    reader = asyncio.StreamReader()
    data = b"".join(encode_frame(f) for f in FRAMES)
    reader.feed_data(data + encode_frame({"cut": True})[:6])
    reader.feed_eof()
    frames = FrameStream(reader.read, chunk_bytes=5)
    got = [await frames.next() for _ in FRAMES]
    assert got == FRAMES
    assert await frames.next() is None
    assert frames.decoder.pending == 6
