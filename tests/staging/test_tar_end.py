"""Archives are read to their declared end: a damaged header, a missing end-of-archive
block or a compressed stream that fails its check is refused, naming where it broke
(Python's tarfile ends quietly there, and the ingest took a shorter archive)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import shutil
import subprocess
import tarfile

import pytest

from dlfs.errors import InvalidArgument
from dlfs.staging.tar_archive import TarSource

MEMBER_BYTES = 1000  # one header block and two data blocks each
MEMBER_SPAN = 512 + 1024
COMPRESSORS = {".tar": lambda data: data, ".tar.gz": gzip.compress, ".tar.bz2": bz2.compress,
               ".tar.xz": lzma.compress}


def six_members() -> tuple[bytes, dict[str, bytes]]:
    """A plain (ustar) archive of six 1000-byte members f1..f6, and the members."""
    files = {f"f{i}": os.urandom(MEMBER_BYTES) for i in range(1, 7)}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue(), files


def corrupt_header(data: bytes, member_index: int) -> bytes:
    """`data` with the checksum of member `member_index`'s header (0-based) spoilt."""
    damaged = bytearray(data)
    at = member_index * MEMBER_SPAN
    damaged[at + 148:at + 156] = b"0000000\0"
    return bytes(damaged)


def read_whole(source: TarSource) -> dict[str, bytes]:
    """Every member's bytes as the reader pool would get them."""
    got: dict[str, bytes] = {}

    class Ctx:
        chunk_bytes = 1 << 20
        name = None

        def reserve(self, n):
            pass

        def push(self, file, data, last, source_bytes, reserved):
            if file is not None:
                Ctx.name = file.path
                got[file.path] = b""
            if data:
                got[Ctx.name] += data

    for unit in source.units():
        unit(Ctx())
    return got


def write(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_a_whole_archive_reads_whole(tmp_path, suffix):
    data, files = six_members()
    path = write(tmp_path, "a" + suffix, COMPRESSORS[suffix](data))
    assert [f.path for f in TarSource(path).entries()] == list(files)
    assert read_whole(TarSource(path)) == files


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_a_corrupt_fourth_header_of_six_is_refused_with_its_offset(tmp_path, suffix):
    """The issue's archive: tarfile listed f1..f3 and stopped; GNU tar exits 2."""
    data, _files = six_members()
    path = write(tmp_path, "bad" + suffix, COMPRESSORS[suffix](corrupt_header(data, 3)))
    offset = f"byte {3 * MEMBER_SPAN:,}"
    for attempt in (lambda: list(TarSource(path).entries()),
                    lambda: read_whole(TarSource(path))):
        with pytest.raises(InvalidArgument) as caught:
            attempt()
        message = caught.value.message
        assert f"archive {path!r} is damaged: the header at {offset}" in message, message
        assert "after member 'f3'" in message and "bad checksum" in message
        assert ("of its uncompressed tar stream" in message) == (suffix != ".tar")
    if shutil.which("tar") and suffix == ".tar":  # what GNU tar says of it
        listing = subprocess.run(["tar", "tf", path], capture_output=True, text=True)
        assert listing.returncode == 2 and "Skipping to next header" in listing.stderr


def test_an_archive_cut_where_a_header_would_start_is_refused(tmp_path):
    data, _files = six_members()
    path = write(tmp_path, "cut.tar", data[:3 * MEMBER_SPAN])
    with pytest.raises(InvalidArgument, match=r"is truncated: it ends at byte 4,608, after "
                                              r"member 'f3', without its end-of-archive block"):
        list(TarSource(path).entries())


def test_an_archive_cut_inside_a_header_is_refused(tmp_path):
    data, _files = six_members()
    path = write(tmp_path, "cut.tar", data[:3 * MEMBER_SPAN + 100])
    with pytest.raises(InvalidArgument, match=r"truncated inside the header at byte 4,608, "
                                              r"after member 'f3'"):
        read_whole(TarSource(path))


def test_a_lone_zero_block_ends_an_archive_as_for_gnu_tar(tmp_path):
    data, files = six_members()
    path = write(tmp_path, "lone.tar", data[:6 * MEMBER_SPAN + 512])
    assert read_whole(TarSource(path)) == files


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.bz2", ".tar.xz"])
def test_a_compressed_archive_that_fails_its_check_is_refused(tmp_path, suffix):
    data, _files = six_members()
    packed = COMPRESSORS[suffix](data)
    path = write(tmp_path, "short" + suffix, packed[:-6])  # its trailer (and CRC) cut off
    with pytest.raises(InvalidArgument, match="is damaged"):
        read_whole(TarSource(path))


def test_a_flipped_bit_in_gzip_data_is_refused(tmp_path):
    """Deflate often decodes a flipped bit into other bytes without an error; the gzip
    CRC at the stream's end is what catches it, so the stream is read to its end."""
    data, _files = six_members()
    packed = bytearray(gzip.compress(data, compresslevel=0))  # stored blocks: no decode error
    packed[2 * MEMBER_SPAN + 600] ^= 0x01  # inside f3's data
    path = write(tmp_path, "flip.tar.gz", bytes(packed))
    with pytest.raises(InvalidArgument, match="CRC check failed"):
        read_whole(TarSource(path))


def test_an_archive_written_by_gnu_tar_reads_whole(tmp_path):
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    _data, files = six_members()
    tree = tmp_path / "tree"
    tree.mkdir()
    for name, content in files.items():
        (tree / name).write_bytes(content)
    path = str(tmp_path / "gnu.tar.gz")
    subprocess.run(["tar", "czf", path, "-C", str(tree), *sorted(files)], check=True)
    assert read_whole(TarSource(path)) == files
