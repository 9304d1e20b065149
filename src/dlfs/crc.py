"""CRC32C, the checksum of every stored byte: the package's one implementation.

`crc32c(data, value=0)` is the CRC32C (Castagnoli, RFC 3720) of a
bytes-like object (bytes, a memoryview of a mapping, a numpy array),
continued from `value`, the CRC of the bytes before it.

From crc32c-rs, which picks at import the fastest kernel the CPU has
(AVX-512 VPCLMULQDQ folding, SSE4.2 with PCLMUL, a table fallback) and
releases the GIL while it runs: faster than the `crc32c` package that
preceded it (log-datapath.md, 2026-11-26 22:07); a client verifying every
sample it receives is bound by this.  The tests check it against that
package (an independent implementation).
"""

from __future__ import annotations

from crc32c_rs import crc32c

__all__ = ["crc32c"]
