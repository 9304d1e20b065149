"""Checkpoint spaces at replay: their records folded into trees, and written back whole.

`replay_spaces` applies the space records (space_records.py) in log order to
one `SpaceTree` per space; the versions the trees name at the end are the
live ones, whose extent directories replay keeps (catalog_replay.py removes
every other directory, the versions of files that were being written when
the daemon stopped among them: their space is given back).  `records_of`
is a tree as the records that rebuild it, for compaction.  Nothing here
imports grpc.
"""

from __future__ import annotations

import logging

from dlfs.errors import DlfsError
from dlfs.server.core import catalog_records as records
from dlfs.server.core import space_records as srec
from dlfs.server.core.catalog_records import RecordType
from dlfs.server.core.space_tree import SpaceTree

log = logging.getLogger(__name__)


def replay_spaces(logged) -> tuple[dict[int, SpaceTree], int, int]:
    """(the spaces by id, the largest space or version id seen, payload bytes of the
    live spaces' records) from the catalog's `logged` (type, payload) records."""
    spaces: dict[int, SpaceTree] = {}
    max_id = 0
    for rtype, payload in logged:
        if rtype not in srec.SPACE_RECORD_TYPES and rtype is not RecordType.DELETE:
            continue
        try:
            max_id = max(max_id, _apply(spaces, rtype, payload))
        except (DlfsError, ValueError, KeyError) as exc:
            log.error("catalog record %s does not apply to its space (%s); skipped",
                      rtype.name, exc)
    return spaces, max_id, sum(_record_bytes(tree) for tree in spaces.values())


def _apply(spaces: dict[int, SpaceTree], rtype: RecordType, payload: bytes) -> int:
    """Apply one record; return the largest id it names."""
    if rtype is RecordType.DELETE:
        spaces.pop(records.decode_delete(payload), None)
        return 0
    if rtype is RecordType.SPACE:
        space_id, created_ns, name = srec.decode_space(payload)
        spaces[space_id] = SpaceTree(space_id, name, created_ns)
        return space_id
    if rtype is RecordType.FILE:
        space_id, path, version = srec.decode_file(payload)
        tree = spaces.get(space_id)
        if tree is not None:
            tree.link(path, version)
        return version.version_id
    if rtype is RecordType.MKDIR:
        space_id, path, mode, mtime_ns = srec.decode_mkdir(payload)
        tree = spaces.get(space_id)
        if tree is not None:
            tree.mkdir(path, mode, mtime_ns)
        return 0
    if rtype is RecordType.REMOVE:
        space_id, path, is_dir, mtime_ns = srec.decode_remove(payload)
        tree = spaces.get(space_id)
        if tree is not None:
            tree.remove(path, is_dir, mtime_ns)
        return 0
    space_id, source, target, mtime_ns = srec.decode_rename(payload)
    tree = spaces.get(space_id)
    if tree is not None:
        tree.rename(source, target, mtime_ns)
    return 0


def records_of(tree: SpaceTree) -> list[tuple[RecordType, bytes]]:
    """The records that rebuild `tree`: SPACE, a MKDIR per directory (parents first),
    a FILE per file."""
    out = [(RecordType.SPACE, srec.encode_space(tree.space_id, tree.created_ns, tree.name))]
    for path in sorted((p for p in tree.dir_meta if p), key=lambda p: (p.count("/"), p)):
        mode, mtime_ns = tree.dir_meta[path]
        out.append((RecordType.MKDIR, srec.encode_mkdir(tree.space_id, path, mode, mtime_ns)))
    for path, version in sorted(tree.versions(), key=lambda pv: pv[0]):
        out.append((RecordType.FILE, srec.encode_file(tree.space_id, path, version)))
    return out


def _record_bytes(tree: SpaceTree) -> int:
    return sum(len(payload) for _, payload in records_of(tree))
