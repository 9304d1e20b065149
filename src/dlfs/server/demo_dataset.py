"""A small generated dataset for the README's first command and for tests.

Class-folder layout (ImageFolder style) of `.npy` arrays, so the files can
be read with `np.load` both through the client and through the FUSE mount.
"""

from __future__ import annotations

import io
from typing import Iterator

import numpy as np

CLASSES = ("bird", "cat", "dog")
DEMO_DATASET = "demo"


def demo_files(samples_per_class: int = 100, seed: int = 0) -> Iterator[tuple[str, bytes]]:
    """Yield (path, contents) of the demo dataset, in sorted path order."""
    rng = np.random.default_rng(seed)
    yield "README.txt", (
        b"DLFS demo dataset: train/ and val/ hold one folder per class of 32x32 RGB\n"
        b"uint8 arrays saved with numpy.save; the folder name is the label.\n"
    )
    for split, count in (("train", samples_per_class), ("val", max(1, samples_per_class // 5))):
        for label, name in enumerate(CLASSES):
            for i in range(count):
                image = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                image[..., label] //= 2  # a faint class signal, so a model can learn something
                buffer = io.BytesIO()
                np.save(buffer, image)
                yield f"{split}/{name}/{i:05d}.npy", buffer.getvalue()
