"""The safetensors header parser refuses every malformed file with its own error, one line."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightdiag.errors import CheckpointFormatError
from weightdiag.source.safetensors_header import MAX_HEADER_BYTES, parse_file_bytes
from weightdiag.testing.synthetic import header_bytes


def _file(header: dict | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


VALID = header_bytes([("a", "F32", (2, 3)), ("b", "BF16", (4,))]) + bytes(24 + 8)


def test_valid_file_parses_with_metadata_and_offsets():
    h = parse_file_bytes(VALID)
    assert [t.name for t in h.tensors] == ["a", "b"]
    assert h.metadata == {"format": "pt"}
    a, b = h.tensors
    assert (a.start, a.end) == (h.data_start, h.data_start + 24)
    assert (b.start, b.end) == (h.data_start + 24, h.data_start + 32)
    assert a.numel == 6
    assert b.dtype.name == "BF16"


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x01\x02", "too short"),
        (VALID[:-5], "truncated or offsets out of range"),
        (
            _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, length=10_000),
            "runs past the end",
        ),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds"),
        (_file(b"{not json"), "not valid UTF-8 JSON"),
        (_file(b"\xff\xfe{}"), "not valid UTF-8 JSON"),
        (_file(b"[1, 2]"), "not an object"),
        (_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), "out of range"),
        (
            _file(
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                },
                b"\0" * 8,
            ),
            "overlap",
        ),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "gap"),
        (_file({"a": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8), "unknown dtype"),
        (_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), "needs 12 bytes"),
        (_file({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8), "invalid shape"),
        (_file({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4), "invalid shape"),
        (
            _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4),
            "invalid data_offsets",
        ),
        (_file({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4), "no valid data_offsets"),
        (
            _file(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": 1}', b"\0" * 4),
            "duplicate",
        ),
        (_file({"__metadata__": {"x": 1}}), "__metadata__"),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9), "not described"),
        (_file({"a": 5}), "not an object"),
    ],
)
def test_malformed_headers_are_refused(blob, message):
    with pytest.raises(CheckpointFormatError) as info:
        parse_file_bytes(blob, "x.safetensors")
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert text.startswith("x.safetensors: ")


def _check_invariants(blob: bytes) -> None:
    try:
        h = parse_file_bytes(blob)
    except CheckpointFormatError:
        return
    cursor = h.data_start
    for t in h.tensors:  # accepted headers tile the data region exactly
        assert t.start == cursor
        assert t.end <= len(blob)
        cursor = t.end
    assert cursor == len(blob)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(blob):
    _check_invariants(blob)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_fuzz_mutated_valid_file(data):
    blob = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    _check_invariants(bytes(blob[:cut]) if data.draw(st.booleans()) else bytes(blob))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
entries = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from(["F32", "BF16", "F16", "I64", "U8", "F4", "C64", "X"]) | json_values,
        "shape": st.lists(st.integers(-2, 6), max_size=3) | json_values,
        "data_offsets": st.lists(st.integers(-4, 64), min_size=2, max_size=2) | json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=6), entries | json_values, max_size=4), st.integers(0, 80))
def test_fuzz_structured_headers(header, data_len):
    _check_invariants(_file(header, bytes(data_len)))
