"""Zero-copy framing of BatchChunk messages for the hot read path.

A BatchChunk is standard protobuf on the wire, but the daemon writes its
`data` field (field 1) first and serializes the small header fields after
it, so a receiver can slice the payload out of the received buffer instead
of letting protobuf copy it twice.  Any protobuf parser still reads these
messages (fields may come in any order), and `decode_chunk` falls back to a
plain parse when `data` is not first.
"""

from __future__ import annotations

from dlfs.proto import dlfs_pb2 as pb

_DATA_TAG = 0x0A  # field 1, wire type 2 (length-delimited)


def varint(value: int) -> bytes:
    """`value` as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def encode_chunk(header: pb.BatchChunk, data) -> bytes:
    """Serialize `header` (without data) plus `data` as one BatchChunk.

    One copy of `data` (into the returned bytes); `header.data` must be empty.
    """
    assert not header.data
    return b"".join((bytes((_DATA_TAG,)), varint(len(data)), data, header.SerializeToString()))


def decode_chunk(raw: bytes) -> tuple[pb.BatchChunk, memoryview]:
    """Split a received BatchChunk into (header, data view).  No copy of the data."""
    if raw[:1] == bytes((_DATA_TAG,)):
        length, shift, pos = 0, 0, 1
        while True:
            byte = raw[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        end = pos + length
        if end <= len(raw):
            header = pb.BatchChunk.FromString(raw[end:])
            if not header.data:
                return header, memoryview(raw)[pos:end]
    message = pb.BatchChunk.FromString(raw)
    return message, memoryview(message.data)
