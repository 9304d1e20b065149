"""Frames of the data path (version 1): sample bytes between daemon and client.

The contract, with the reasons, is `dlfs/proto/datapath.md`; this module is
its one implementation, shared by the daemon and the client.  Every frame
is an 8-byte header (kind, flags, reserved, body length; little endian)
followed by its body.  Fixed parts of bodies are `struct` layouts; arrays
ride as raw little-endian bytes, which numpy views without copying.

Nothing here touches sockets or imports grpc: the daemon and the client
own their I/O, so each can receive straight into memory it chose.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import numpy as np

from dlfs import errors, limits
from dlfs.version import RELEASE_BYTES_MAX, __version__

# The layout of HELLO and WELCOME, which carry the two ends' releases: who talks to
# whom is `dlfs.version`'s policy (one minor release), checked at the handshake.
VERSION = 2
HELLO_MAGIC = b"DLFSDATA"

FRAME = struct.Struct("<BBHI")  # kind, flags, reserved (0), body bytes
HELLO = struct.Struct("<8sHH16s")  # magic, layout version, token bytes, client release
WELCOME = struct.Struct("<HHI16s16s")  # layout version, reserved, window bytes, daemon
#                                        instance, daemon release; then LIMITS
GET_BATCH = struct.Struct("<QIIIHBB")  # generation, flags, ids, hint ids, name bytes,
#                                        request id bytes, reserved
READ_RANGE = struct.Struct("<QqQQIHBB")  # generation, sample id, offset, length, flags,
#                                          name bytes, request id bytes, reserved
STAT_DATASET = struct.Struct("<HBB")  # name bytes, request id bytes, reserved
OPEN_DATASET = struct.Struct("<QHBB")  # generation, name bytes, request id bytes, reserved
BATCH = struct.Struct("<QQII")  # generation, payload bytes, samples, flags
ERROR = struct.Struct("<HHIHH")  # status code, class name bytes, message bytes,
#                                  request id bytes, split (Overloaded.split; was reserved)
DATASET = struct.Struct("<QQQ")  # generation, samples, bytes
INDEX = struct.Struct("<QQII")  # generation, samples, extents, reserved
BLOCK_CRCS = struct.Struct("<QqHBB")  # generation, sample id, name bytes, request id bytes,
#                                       reserved
CRCS = struct.Struct("<QII")  # generation served, block bytes, CRCs that follow
FDS = struct.Struct("<I")  # descriptors riding on this frame (SCM_RIGHTS)
INGEST_START = struct.Struct("<QIHBB")  # resume from (files), flags, name bytes,
#                                         request id bytes, reserved
PIECE = struct.Struct("<BBHIQIIq")  # flags, reserved, path bytes, CRC32C, size, mode,
#                                     reserved, mtime ns; then path, then data (rest of body)
INGEST_END = struct.Struct("<QQ")  # files, data bytes the stream carried
INGEST_READY = struct.Struct("<Q")  # files the daemon already holds (a resume's start)
INGESTED = struct.Struct("<QQQqIHH")  # generation, samples, bytes, created ns, extents,
#                                       name bytes, reserved
# INGEST_START flags
INGEST_REPLACE, INGEST_RESUMABLE, INGEST_RESUME = 0x1, 0x2, 0x4
# PIECE flags: the piece starts a file (path, size, mode, mtime valid); it ends one
# (CRC32C valid: of the whole file, as the client read it).
PIECE_FIRST, PIECE_LAST = 0x1, 0x2
# PIECE flag (with PIECE_FIRST, no data): the path is an empty directory of the dataset.
PIECE_DIRECTORY = 0x4
# Bytes of the index arrays per sample: extent u32, offset u64, length u64, CRC32C u32.
INDEX_BYTES_PER_SAMPLE = 24

# BATCH flags: the reply's CRC32Cs cover its items (whole samples, or blocks).
BATCH_CRCS = 0x1
# BATCH flag: the items are the blocks (dlfs.formats.block_crcs) around a READ_RANGE's
# part of a sample; RANGE_TAIL follows the CRCs and says where the range is.
BATCH_BLOCKS = 0x2
RANGE_TAIL = struct.Struct("<QQ")  # payload bytes before the range, range bytes
# BATCH flag: the request's hint ids were dropped (the daemon's prefetch queue
# was full); only speed is lost.
BATCH_HINTS_DROPPED = 0x4
# READ_RANGE flag: the client verifies block by block; widen a part of a sample
# with block CRCs to whole blocks and answer with BATCH_BLOCKS.
RANGE_BLOCKS = 0x1
LIMITS = struct.Struct("<IIQ")  # batch ids max, request frame body bytes max, batch bytes max


class Kind(enum.IntEnum):
    # client -> daemon
    HELLO = 1
    GET_BATCH = 2
    READ_RANGE = 3
    STAT_DATASET = 4
    OPEN_DATASET = 5
    INGEST_START = 6
    PIECE = 7
    INGEST_END = 8
    BLOCK_CRCS = 9  # only to a daemon whose WELCOME has WELCOME_BLOCK_CRCS
    # the write conversation (datapath_writes.py)
    FILE_OPEN = 10
    FILE_WRITE = 11
    FILE_TRUNCATE = 12
    FILE_SYNC = 13
    FILE_READ = 14
    FILE_CLOSE = 15
    # daemon -> client
    WELCOME = 64
    ERROR = 65
    BATCH = 66
    DATA = 67
    DATASET = 68
    INDEX = 69
    FDS = 70
    INGEST_READY = 71
    INGESTED = 72
    CRCS = 73
    FILE_OPENED = 74
    FILE_STATE = 75
    FILE_DATA = 76
    WRITE_FAILED = 77  # an ERROR's body, sent unasked: a FILE_WRITE or FILE_TRUNCATE failed


# gRPC's numeric status codes, so both paths report failures the same way.
STATUS_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3,
                "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5, "ALREADY_EXISTS": 6,
                "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
                "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13,
                "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16}
_CODE_NAMES = {number: name for name, number in STATUS_CODES.items()}


class FrameError(ValueError):
    """A frame that breaks the protocol; the receiver closes the connection after it."""


def frame(kind: Kind, body_bytes: int, flags: int = 0) -> bytes:
    return FRAME.pack(kind, flags, 0, body_bytes)


def parse_frame(header) -> tuple[int, int, int]:
    """(kind, flags, body bytes) of an 8-byte frame header."""
    kind, flags, _reserved, length = FRAME.unpack(header)
    return kind, flags, length


# --- client -> daemon -------------------------------------------------------------------

class Hello(NamedTuple):
    """A HELLO: its layout version, the client's release and its token (both "" when the
    layout is another one: nothing after the version can be read then)."""

    version: int
    release: str
    token: str


def hello(token: str, *, release: str = __version__) -> bytes:
    """A HELLO frame from a client of `release`."""
    raw = token.encode()
    if len(raw) > limits.datapath_token_bytes_max:
        raise errors.InvalidArgument(f"a token of {len(raw)} bytes is over the limit of "
                                     f"{limits.datapath_token_bytes_max}")
    body = HELLO.pack(HELLO_MAGIC, VERSION, len(raw), _release_field(release)) + raw
    return frame(Kind.HELLO, len(body)) + body


def parse_hello(body) -> Hello:
    """The HELLO of `body`.  Raises FrameError."""
    if len(body) < len(HELLO_MAGIC) + _LAYOUT.size or bytes(body[:len(HELLO_MAGIC)]) != HELLO_MAGIC:
        raise FrameError("not a DLFS data path client (bad HELLO magic)")
    (version,) = _LAYOUT.unpack_from(body, len(HELLO_MAGIC))
    if version != VERSION:
        return Hello(version, "", "")
    if len(body) < HELLO.size:
        raise FrameError("a HELLO frame is shorter than its fixed part")
    _magic, _version, token_bytes, release = HELLO.unpack_from(body)
    if len(body) != HELLO.size + token_bytes:
        raise FrameError("a HELLO frame's token length does not match its body")
    return Hello(version, _release_text(release), _text(body[HELLO.size:], "token"))


# The version that starts HELLO (after its magic) and WELCOME in every layout.
_LAYOUT = struct.Struct("<H")


def _release_field(release: str) -> bytes:
    raw = release.encode()
    assert len(raw) <= RELEASE_BYTES_MAX, release
    return raw


def _release_text(field: bytes) -> str:
    return _text(field.rstrip(b"\0"), "release")


class GetBatchFrame(NamedTuple):
    dataset: str
    generation: int  # 0: the current one
    ids: np.ndarray  # int64, request order
    hints: np.ndarray  # int64: samples wanted next (read-ahead hint)
    request_id: str
    flags: int


class ReadRangeFrame(NamedTuple):
    dataset: str
    generation: int
    sample_id: int
    offset: int
    length: int  # 0: to the end
    request_id: str
    flags: int


def get_batch(dataset: str, ids: np.ndarray, *, generation: int = 0,
              hints: np.ndarray | None = None, request_id: str = "",
              flags: int = 0) -> list:
    """A GET_BATCH frame as buffers to send in order (the id arrays are not copied)."""
    ids = np.ascontiguousarray(ids, dtype="<i8")
    hints = np.ascontiguousarray(hints if hints is not None else (), dtype="<i8")
    name, rid = dataset.encode(), request_id.encode()
    fixed = GET_BATCH.pack(generation, flags, ids.size, hints.size, len(name), len(rid), 0)
    body = len(fixed) + len(name) + len(rid) + ids.nbytes + hints.nbytes
    return [frame(Kind.GET_BATCH, body) + fixed + name + rid, memoryview(ids).cast("B"),
            memoryview(hints).cast("B")]


def get_batch_ids(fixed) -> int:
    """The ids a GET_BATCH asks for, from its body's fixed part (the first
    GET_BATCH.size bytes): a daemon tells a frame over its limit by this count."""
    if len(fixed) < GET_BATCH.size:
        raise FrameError("a GET_BATCH frame is shorter than its fixed part")
    return GET_BATCH.unpack_from(fixed)[2]


def parse_get_batch(body) -> GetBatchFrame:
    """The request of a GET_BATCH body (id arrays are views of `body`).  Raises FrameError."""
    if len(body) < GET_BATCH.size:
        raise FrameError("a GET_BATCH frame is shorter than its fixed part")
    generation, flags, count, hints, name_bytes, rid_bytes, _ = GET_BATCH.unpack_from(body)
    at = GET_BATCH.size
    if len(body) != at + name_bytes + rid_bytes + 8 * (count + hints):
        raise FrameError("a GET_BATCH frame's counts do not match its body")
    name = _text(body[at:at + name_bytes], "dataset name")
    at += name_bytes
    rid = _text(body[at:at + rid_bytes], "request id")
    at += rid_bytes
    ids = np.frombuffer(body, "<i8", count, at)
    hint_ids = np.frombuffer(body, "<i8", hints, at + 8 * count)
    return GetBatchFrame(name, generation, ids, hint_ids, rid, flags)


def read_range(dataset: str, sample_id: int, offset: int, length: int, *,
               generation: int = 0, request_id: str = "", flags: int = 0) -> bytes:
    name, rid = dataset.encode(), request_id.encode()
    body = READ_RANGE.pack(generation, sample_id, offset, length, flags, len(name), len(rid),
                           0) + name + rid
    return frame(Kind.READ_RANGE, len(body)) + body


def parse_read_range(body) -> ReadRangeFrame:
    if len(body) < READ_RANGE.size:
        raise FrameError("a READ_RANGE frame is shorter than its fixed part")
    (generation, sample_id, offset, length, flags, name_bytes, rid_bytes,
     _) = READ_RANGE.unpack_from(body)
    at = READ_RANGE.size
    if len(body) != at + name_bytes + rid_bytes:
        raise FrameError("a READ_RANGE frame's lengths do not match its body")
    name = _text(body[at:at + name_bytes], "dataset name")
    rid = _text(body[at + name_bytes:], "request id")
    return ReadRangeFrame(name, generation, sample_id, offset, length, rid, flags)


def stat_dataset(dataset: str, request_id: str = "") -> bytes:
    name, rid = dataset.encode(), request_id.encode()
    body = STAT_DATASET.pack(len(name), len(rid), 0) + name + rid
    return frame(Kind.STAT_DATASET, len(body)) + body


def parse_stat_dataset(body) -> tuple[str, str]:
    """(dataset, request id) of a STAT_DATASET body."""
    if len(body) < STAT_DATASET.size:
        raise FrameError("a STAT_DATASET frame is shorter than its fixed part")
    name_bytes, rid_bytes, _ = STAT_DATASET.unpack_from(body)
    return _name_and_request_id(body, STAT_DATASET.size, name_bytes, rid_bytes,
                                "a STAT_DATASET frame")


def open_dataset(dataset: str, generation: int = 0, request_id: str = "") -> bytes:
    name, rid = dataset.encode(), request_id.encode()
    body = OPEN_DATASET.pack(generation, len(name), len(rid), 0) + name + rid
    return frame(Kind.OPEN_DATASET, len(body)) + body


def parse_open_dataset(body) -> tuple[str, int, str]:
    """(dataset, generation, request id) of an OPEN_DATASET body."""
    if len(body) < OPEN_DATASET.size:
        raise FrameError("an OPEN_DATASET frame is shorter than its fixed part")
    generation, name_bytes, rid_bytes, _ = OPEN_DATASET.unpack_from(body)
    name, rid = _name_and_request_id(body, OPEN_DATASET.size, name_bytes, rid_bytes,
                                     "an OPEN_DATASET frame")
    return name, generation, rid


class IngestStartRequest(NamedTuple):
    dataset: str
    flags: int
    resume_from: int
    request_id: str


def ingest_start(dataset: str, *, replace: bool = False, resumable: bool = False,
                 resume_from: int | None = None, request_id: str = "") -> bytes:
    """INGEST_START: the connection carries one dataset's ingest until INGESTED or ERROR."""
    flags = ((INGEST_REPLACE if replace else 0) | (INGEST_RESUMABLE if resumable else 0)
             | (INGEST_RESUME if resume_from is not None else 0))
    name, rid = dataset.encode(), request_id.encode()
    body = INGEST_START.pack(resume_from or 0, flags, len(name), len(rid), 0) + name + rid
    return frame(Kind.INGEST_START, len(body)) + body


def parse_ingest_start(body) -> IngestStartRequest:
    if len(body) < INGEST_START.size:
        raise FrameError("an INGEST_START frame is shorter than its fixed part")
    resume_from, flags, name_bytes, rid_bytes, _ = INGEST_START.unpack_from(body)
    name, rid = _name_and_request_id(body, INGEST_START.size, name_bytes, rid_bytes,
                                     "an INGEST_START frame")
    return IngestStartRequest(name, flags, resume_from, rid)


def piece(path: bytes, data_bytes: int, *, first: bool, last: bool, size: int = 0,
          mode: int = 0, mtime_ns: int = 0, crc: int = 0, directory: bool = False) -> bytes:
    """A PIECE frame's header and path; its `data_bytes` of data follow it on the wire.
    `path` (UTF-8) on a file's first piece only; `directory`: an empty directory's
    piece (first, no data)."""
    flags = (PIECE_FIRST if first else 0) | (PIECE_LAST if last else 0) | \
        (PIECE_DIRECTORY if directory else 0)
    fixed = PIECE.pack(flags, 0, len(path), crc, size, mode, 0, mtime_ns)
    return frame(Kind.PIECE, len(fixed) + len(path) + data_bytes) + fixed + path


class Piece(NamedTuple):
    flags: int
    path: str
    crc: int
    size: int
    mode: int
    mtime_ns: int
    data: memoryview


def parse_piece(body: memoryview) -> Piece:
    if len(body) < PIECE.size:
        raise FrameError("a PIECE frame is shorter than its fixed part")
    flags, _, path_bytes, crc, size, mode, _, mtime_ns = PIECE.unpack_from(body)
    at = PIECE.size + path_bytes
    if len(body) < at or bool(path_bytes) != bool(flags & PIECE_FIRST):
        raise FrameError("a PIECE frame's path does not match its flags or body")
    path = _text(body[PIECE.size:at], "sample path") if path_bytes else ""
    return Piece(flags, path, crc, size, mode, mtime_ns, body[at:])


def ingest_end(files: int, data_bytes: int) -> bytes:
    return frame(Kind.INGEST_END, INGEST_END.size) + INGEST_END.pack(files, data_bytes)


def parse_ingest_end(body) -> tuple[int, int]:
    if len(body) != INGEST_END.size:
        raise FrameError("an INGEST_END frame has the wrong size")
    return INGEST_END.unpack(body)


# --- daemon -> client ---------------------------------------------------------------------

def ingest_ready(files_held: int) -> bytes:
    return frame(Kind.INGEST_READY, INGEST_READY.size) + INGEST_READY.pack(files_held)


def parse_ingest_ready(body) -> int:
    if len(body) != INGEST_READY.size:
        raise FrameError("an INGEST_READY frame has the wrong size")
    return INGEST_READY.unpack(body)[0]


def ingested(name: str, generation: int, samples: int, total_bytes: int, created_ns: int,
             extents: int) -> bytes:
    raw = name.encode()
    body = INGESTED.pack(generation, samples, total_bytes, created_ns, extents, len(raw), 0) + raw
    return frame(Kind.INGESTED, len(body)) + body


def parse_ingested(body) -> tuple[str, int, int, int, int, int]:
    """(name, generation, samples, bytes, created ns, extents) of an INGESTED body."""
    if len(body) < INGESTED.size:
        raise FrameError("an INGESTED frame is shorter than its fixed part")
    generation, samples, total, created, extents, name_bytes, _ = INGESTED.unpack_from(body)
    if len(body) != INGESTED.size + name_bytes:
        raise FrameError("an INGESTED frame's lengths do not match its body")
    return (_text(body[INGESTED.size:], "dataset name"), generation, samples, total, created,
            extents)


class DaemonLimits(NamedTuple):
    """The limits a daemon checks requests against, as its WELCOME tells them: a
    client checks its requests first (`dlfs.batch_limits`), with the same words."""

    batch_ids_max: int
    batch_bytes_max: int
    request_bytes_max: int  # the body of a request frame, at most


def request_bytes_max(batch_ids_max: int) -> int:
    """The largest request frame body a daemon of `batch_ids_max` takes: a GET_BATCH of
    that many ids and as many hint ids (8 bytes each), a name and a request id."""
    return 16 * batch_ids_max + limits.datapath_request_fixed_bytes_max


# The request kinds a served connection may send; all but GET_BATCH are a fixed
# part, a name and a request id (`limits.datapath_request_fixed_bytes_max` at most).
# Kinds a connection's next request may be (the write conversation's other frames
# are read by server/datapath/file_writes.py, against their own maxima).
REQUEST_KINDS = frozenset((Kind.GET_BATCH, Kind.READ_RANGE, Kind.STAT_DATASET,
                           Kind.OPEN_DATASET, Kind.INGEST_START, Kind.BLOCK_CRCS,
                           Kind.FILE_OPEN))


def request_body_bytes_max(kind: int, batch_ids_max: int) -> int | None:
    """The largest body a request frame of `kind` may announce to a daemon of
    `batch_ids_max` (checked on its header, before any of the body is read); None
    when `kind` is not a request."""
    if kind == Kind.GET_BATCH:
        return request_bytes_max(batch_ids_max)
    if kind == Kind.FILE_OPEN:  # it names a path of a checkpoint space (datapath_writes)
        return limits.datapath_request_fixed_bytes_max + limits.path_bytes_max
    return limits.datapath_request_fixed_bytes_max if kind in REQUEST_KINDS else None


def kind_name(kind: int) -> str:
    """A frame kind as messages name it: its name ("PIECE"), or its number ("99")."""
    try:
        return Kind(kind).name
    except ValueError:
        return str(kind)


def reply_header_bytes_max(batch_ids_max: int) -> int:
    """The largest BATCH frame body a daemon of `batch_ids_max` sends (12 bytes a sample)."""
    return 12 * batch_ids_max + limits.datapath_reply_fixed_bytes_max


class Welcome(NamedTuple):
    """A WELCOME: its layout version, the daemon's window bytes, instance id, release and
    limits (release "" and the rest empty when the layout is another one)."""

    version: int
    window_bytes: int
    instance: bytes
    release: str
    limits: DaemonLimits | None


def welcome(window_bytes: int, instance: bytes, daemon_limits: DaemonLimits, *,
            release: str = __version__) -> bytes:
    """A WELCOME frame from a daemon of `release`; its LIMITS follow the fixed part."""
    body = WELCOME.pack(VERSION, 0, window_bytes, instance, _release_field(release)) + \
        LIMITS.pack(daemon_limits.batch_ids_max, daemon_limits.request_bytes_max,
                    daemon_limits.batch_bytes_max)
    return frame(Kind.WELCOME, len(body)) + body


def parse_welcome(body) -> Welcome:
    """The WELCOME of `body`.  Raises FrameError."""
    if len(body) < _LAYOUT.size:
        raise FrameError("a WELCOME frame has the wrong size")
    (version,) = _LAYOUT.unpack_from(body)
    if version != VERSION:
        return Welcome(version, 0, b"", "", None)
    if len(body) != WELCOME.size + LIMITS.size:
        raise FrameError("a WELCOME frame has the wrong size")
    _version, _reserved, window_bytes, instance, release = WELCOME.unpack_from(body)
    ids_max, request_max, bytes_max = LIMITS.unpack_from(body, WELCOME.size)
    if not ids_max or not bytes_max or request_max < request_bytes_max(0):
        raise FrameError("a WELCOME frame's limits are not limits")
    return Welcome(version, window_bytes, instance, _release_text(release),
                   DaemonLimits(ids_max, bytes_max, request_max))


def batch_header(generation: int, lengths: np.ndarray, crcs: np.ndarray, flags: int,
                 tail: tuple[int, int] | None = None) -> list:
    """A BATCH frame (the reply's shape) as buffers to send; the arrays are not copied.
    `tail` (skip, length) is the RANGE_TAIL of a BATCH_BLOCKS reply."""
    assert (tail is not None) == bool(flags & BATCH_BLOCKS)
    lengths = np.ascontiguousarray(lengths, dtype="<u8")
    crcs = np.ascontiguousarray(crcs, dtype="<u4")
    payload = int(lengths.sum())
    fixed = BATCH.pack(generation, payload, lengths.size, flags)
    extra = RANGE_TAIL.pack(*tail) if tail is not None else b""
    body = len(fixed) + lengths.nbytes + crcs.nbytes + len(extra)
    return [frame(Kind.BATCH, body) + fixed, memoryview(lengths).cast("B"),
            memoryview(crcs).cast("B"), extra]


class BatchReply(NamedTuple):
    generation: int
    payload_bytes: int
    lengths: np.ndarray  # uint64 per item (requested sample, or block), request order
    crcs: np.ndarray  # uint32
    flags: int
    skip: int = 0  # BATCH_BLOCKS: payload bytes before the asked range
    length: int = 0  # BATCH_BLOCKS: bytes of the asked range


def parse_batch_header(body) -> BatchReply:
    if len(body) < BATCH.size:
        raise FrameError("a BATCH frame is shorter than its fixed part")
    generation, payload, count, flags = BATCH.unpack_from(body)
    tail = RANGE_TAIL.size if flags & BATCH_BLOCKS else 0
    if len(body) != BATCH.size + 12 * count + tail:
        raise FrameError("a BATCH frame's sample count does not match its body")
    lengths = np.frombuffer(body, "<u8", count, BATCH.size)
    crcs = np.frombuffer(body, "<u4", count, BATCH.size + 8 * count)
    if int(lengths.sum()) != payload:
        raise FrameError("a BATCH frame's lengths do not add up to its payload")
    if not tail:
        return BatchReply(generation, payload, lengths, crcs, flags)
    skip, length = RANGE_TAIL.unpack_from(body, BATCH.size + 12 * count)
    if skip + length > payload:
        raise FrameError("a BATCH frame's range lies outside its payload")
    return BatchReply(generation, payload, lengths, crcs, flags, skip, length)


def data_frame(body_bytes: int) -> bytes:
    return frame(Kind.DATA, body_bytes)


def dataset_reply(generation: int, samples: int, total_bytes: int) -> bytes:
    body = DATASET.pack(generation, samples, total_bytes)
    return frame(Kind.DATASET, len(body)) + body


def parse_dataset_reply(body) -> tuple[int, int, int]:
    if len(body) != DATASET.size:
        raise FrameError("a DATASET frame has the wrong size")
    return DATASET.unpack(body)


def block_crcs(dataset: str, sample_id: int, generation: int = 0, request_id: str = "") -> bytes:
    name, rid = dataset.encode(), request_id.encode()
    body = BLOCK_CRCS.pack(generation, sample_id, len(name), len(rid), 0) + name + rid
    return frame(Kind.BLOCK_CRCS, len(body)) + body


def parse_block_crcs(body) -> tuple[str, int, int, str]:
    """(dataset, generation, sample id, request id) of a BLOCK_CRCS body."""
    if len(body) < BLOCK_CRCS.size:
        raise FrameError("a BLOCK_CRCS frame is shorter than its fixed part")
    generation, sample_id, name_bytes, rid_bytes, _ = BLOCK_CRCS.unpack_from(body)
    name, rid = _name_and_request_id(body, BLOCK_CRCS.size, name_bytes, rid_bytes,
                                     "a BLOCK_CRCS frame")
    return name, generation, sample_id, rid


def _name_and_request_id(body, at: int, name_bytes: int, rid_bytes: int,
                         what: str) -> tuple[str, str]:
    """The dataset name and request id that end a request body at byte `at`."""
    if len(body) != at + name_bytes + rid_bytes:
        raise FrameError(f"{what}'s lengths do not match its body")
    return (_text(body[at:at + name_bytes], "dataset name"),
            _text(body[at + name_bytes:], "request id"))


def crcs_reply(generation: int, block_bytes: int, crcs: np.ndarray | None) -> bytes:
    """A CRCS frame: the CRC32C of every block of one sample; none when it has none."""
    crcs = np.ascontiguousarray(crcs if crcs is not None else [], dtype="<u4")
    body = CRCS.pack(generation, block_bytes, crcs.size) + crcs.tobytes()
    return frame(Kind.CRCS, len(body)) + body


def parse_crcs_reply(body) -> tuple[int, int, np.ndarray | None]:
    """(generation, block bytes, CRC32C per block or None) of a CRCS body."""
    if len(body) < CRCS.size:
        raise FrameError("a CRCS frame is shorter than its fixed part")
    generation, block_bytes, count = CRCS.unpack_from(body)
    if len(body) != CRCS.size + 4 * count or (count and not block_bytes):
        raise FrameError("a CRCS frame's count does not match its body")
    crcs = np.frombuffer(body, "<u4", count, CRCS.size).copy() if count else None
    return generation, block_bytes, crcs


def index_header(generation: int, samples: int, extent_nos: np.ndarray) -> bytes:
    """An INDEX frame: the dataset's version and size, and the extents whose descriptors
    follow in FDS frames, in this order."""
    extent_nos = np.ascontiguousarray(extent_nos, dtype="<u4")
    body = INDEX.pack(generation, samples, extent_nos.size, 0) + extent_nos.tobytes()
    return frame(Kind.INDEX, len(body)) + body


def parse_index_header(body) -> tuple[int, int, np.ndarray]:
    """(generation, samples, extent numbers) of an INDEX body."""
    if len(body) < INDEX.size:
        raise FrameError("an INDEX frame is shorter than its fixed part")
    generation, samples, extents, _ = INDEX.unpack_from(body)
    if len(body) != INDEX.size + 4 * extents:
        raise FrameError("an INDEX frame's extent count does not match its body")
    return generation, samples, np.frombuffer(body, "<u4", extents, INDEX.size).copy()


def fds_frame(count: int) -> bytes:
    return frame(Kind.FDS, FDS.size) + FDS.pack(count)


def error(exc: errors.DlfsError, request_id: str = "") -> bytes:
    """An ERROR frame carrying `exc`'s status code, class name and message, the
    request id the daemon logged the failure under, and for an Overloaded refusal
    by one of several serving processes how many share the limit (`split`)."""
    code = STATUS_CODES.get(exc.status_code_name, STATUS_CODES["UNKNOWN"])
    name = type(exc).__name__.encode()
    message = exc.message.encode(errors="replace")[:limits.datapath_error_bytes_max]
    rid = request_id.encode()
    split = min(getattr(exc, "split", 0), 0xFFFF)
    body = ERROR.pack(code, len(name), len(message), len(rid), split) + name + message + rid
    return frame(Kind.ERROR, len(body)) + body


def parse_error(body, address: str) -> errors.DlfsError:
    """The DlfsError an ERROR body carries (its exact class when known here)."""
    if len(body) < ERROR.size:
        raise FrameError("an ERROR frame is shorter than its fixed part")
    code, name_bytes, message_bytes, rid_bytes, split = ERROR.unpack_from(body)
    at = ERROR.size
    name = bytes(body[at:at + name_bytes]).decode(errors="replace")
    at += name_bytes
    message = bytes(body[at:at + message_bytes]).decode(errors="replace")
    at += message_bytes
    request_id = bytes(body[at:at + rid_bytes]).decode(errors="replace")
    code_name = _CODE_NAMES.get(code, "UNKNOWN")
    cls = errors.ERROR_BY_STATUS_CODE_NAME.get(code_name, errors.Internal)
    named = errors.ERROR_BY_CLASS_NAME.get(name)
    if named is not None and named.status_code_name == cls.status_code_name:
        cls = named
    if cls is errors.Unavailable:
        message = f"DLFS daemon at {address}: {message}"
    exc = cls(message)
    exc.request_id = request_id or None
    if split and isinstance(exc, errors.Overloaded):
        exc.split = split
    return exc


def _text(raw, what: str) -> str:
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        raise FrameError(f"the {what} is not UTF-8") from None
