"""CRC32C, the checksum of every stored byte: the package's one implementation.

`crc32c(data, value=0)` is the CRC32C (Castagnoli, RFC 3720) of a
bytes-like object (bytes, a memoryview of a mapping, a numpy array),
continued from `value`, the CRC of the bytes before it.

From crc32c-rs, which picks at import the fastest kernel the CPU has
(AVX-512 VPCLMULQDQ folding, SSE4.2 with PCLMUL, a table fallback) and
releases the GIL while it runs.  Measured on the 2-core VM (AVX-512):
44 GB/s on cache-hot 110 KB pieces and 20 GB/s on pieces streamed from
memory, against 18 and 12 GB/s for the `crc32c` package that preceded it;
a client verifying every sample it receives is bound by this.  The tests
check it against that package (an independent implementation).
"""

from __future__ import annotations

from crc32c_rs import crc32c

__all__ = ["crc32c"]
