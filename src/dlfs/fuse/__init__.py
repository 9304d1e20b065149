"""`dlfs-mount`: a read-only FUSE file system over a DLFS daemon (pyfuse3 + trio).

Modules, one job each:

- `main`: the command line, mounting, background start, signals, readiness.
- `fs`: pyfuse3 requests translated to the pieces below; only FUSEError escapes.
- `inodes`: inode numbers, lookup counts, bounded idle nodes.
- `dirlist`: one open directory, listed page by page at kernel offsets.
- `readcache`: sample bytes staged between the daemon and the page cache.
- `backend`: blocking calls to the daemon (run in worker threads).
- `errno_map`: the one table from DLFS errors to errno values.
- `limits`: every bound of the FUSE layer, with its reason.
"""
