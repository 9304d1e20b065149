"""A dataset's folder layout as `DLFSDataset` items: the samples below a root, their class folders.

Torch-free: both functions work on the dataset's sorted path listing.
"""

from __future__ import annotations

import numpy as np

from dlfs.errors import InvalidArgument, NotFound


def samples_below(paths: list[str], root: str, name: str) -> tuple[np.ndarray, list[str]]:
    """Ids (int64) and paths of the samples below `root` (all of them when `root` is "").

    `paths` is dataset `name`'s listing, in id order.  Raises NotFound when
    no sample lies below `root`.  Cost: O(len(paths)).
    """
    if not root:
        return np.arange(len(paths), dtype=np.int64), paths
    prefix = root + "/"
    # Ids are in sorted path order, so the samples below a directory are one run of ids.
    ids = np.fromiter((i for i, p in enumerate(paths) if p.startswith(prefix)), dtype=np.int64)
    if not len(ids):
        raise NotFound(f"dataset {name!r} has no samples below {root!r}; "
                       "`dlfs ls` shows its directories")
    return ids, [paths[i] for i in ids.tolist()]


def parent_dir_labels(paths: list[str], root: str,
                      name: str) -> tuple[list[str], dict[str, int], np.ndarray]:
    """ImageFolder-style labels of `paths` (all below `root`): classes, class_to_idx, targets.

    A sample's class is the name of the folder holding it; classes sorted by
    name get 0..C-1, and targets are each path's class index (int64).
    Raises InvalidArgument, naming the sample, for a sample directly in
    `root`.  Cost: O(len(paths)).
    """
    skip = len(root) + 1 if root else 0
    folders = []
    for path in paths:
        folder, slash, _file = path[skip:].rpartition("/")
        if not slash:
            raise InvalidArgument(
                f"sample {path!r} of dataset {name!r} is not in a class folder below "
                f"{root or 'the dataset root'!r}; with target='parent_dir' every sample must be "
                "(pass root='SUBDIR' to start lower, or target=None)")
        folders.append(folder.rpartition("/")[2])
    classes = sorted(set(folders))
    class_to_idx = {c: i for i, c in enumerate(classes)}
    targets = np.fromiter((class_to_idx[f] for f in folders), dtype=np.int64, count=len(folders))
    return classes, class_to_idx, targets
