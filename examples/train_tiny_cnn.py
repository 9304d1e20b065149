"""Train a tiny CNN on a generated JPEG dataset read through DLFS.

    ./dev demo                                   # a daemon on 127.0.0.1:7010 (README)
    .venv/bin/python examples/train_tiny_cnn.py  # in a second shell
    .venv/bin/python examples/train_tiny_cnn.py --epochs 3 --workers 2 --trace /tmp/trace.json

Needs the torch extra (``pip install '.[torch]'`` in a checkout: torch and Pillow).

What it does:
1. draws a small ImageFolder-style dataset with Pillow: 32x32 JPEGs of
   three classes (a disc, a square, horizontal stripes, at random places and
   colours), ``train/<class>/*.jpg`` and ``val/<class>/*.jpg``;
2. ingests it into the daemon as dataset ``tiny-shapes`` (replacing an old one);
3. trains a two-layer CNN on the CPU with `DLFSDataset` (labels from the
   class folders, JPEG decoded in the DataLoader workers) and
   `ShuffleShardSampler` (a new order each epoch; in a torch.distributed
   job each rank would read its own share);
4. prints loss and accuracy per epoch, then the `dlfs.training.profile` I/O table:
   how much of the time the loop waited for data.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tempfile

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import DataLoader

from dlfs import Client
from dlfs.training.profile import Timeline
from dlfs.torch import DLFSDataset, ShuffleShardSampler

CLASSES = ("disc", "square", "stripes")
SIZE = 32


def draw(kind: str, rng: random.Random) -> Image.Image:
    """One 32x32 RGB picture of class `kind` on a noisy background."""
    background = np.random.default_rng(rng.getrandbits(32)).integers(
        0, 90, size=(SIZE, SIZE, 3), dtype=np.uint8)
    image = Image.fromarray(background)
    pen = ImageDraw.Draw(image)
    colour = tuple(rng.randint(140, 255) for _ in range(3))
    if kind == "stripes":
        for y in range(rng.randint(0, 3), SIZE, 6):
            pen.rectangle([0, y, SIZE, y + 2], fill=colour)
        return image
    r = rng.randint(6, 11)
    x, y = rng.randint(r, SIZE - r), rng.randint(r, SIZE - r)
    if kind == "disc":
        pen.ellipse([x - r, y - r, x + r, y + r], fill=colour)
    else:
        pen.rectangle([x - r, y - r, x + r, y + r], fill=colour)
    return image


def generate(root: str, per_class: int, seed: int) -> None:
    rng = random.Random(seed)
    for split, count in (("train", per_class), ("val", max(1, per_class // 4))):
        for kind in CLASSES:
            os.makedirs(os.path.join(root, split, kind), exist_ok=True)
            for i in range(count):
                draw(kind, rng).save(os.path.join(root, split, kind, f"{i:05d}.jpg"),
                                     quality=90)


def decode(sample) -> torch.Tensor:
    """JPEG bytes (a memoryview from DLFS) -> float CHW tensor in [0, 1]."""
    image = Image.open(io.BytesIO(sample)).convert("RGB")
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255.0


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 16x16
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x8
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, len(CLASSES)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get("DLFS_SERVER", "127.0.0.1:7010"))
    parser.add_argument("--dataset", default="tiny-shapes")
    parser.add_argument("--per-class", type=int, default=300, help="training images per class")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", default=None, help="write a Perfetto/Chrome trace here")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    with tempfile.TemporaryDirectory() as tmp, Client(args.server) as client:
        generate(tmp, args.per_class, args.seed)
        info = client.ingest(tmp, args.dataset, replace=True, progress=False)
        print(f"ingested {args.dataset}: {info.samples} JPEGs into {args.server}")

    train = DLFSDataset(args.server, args.dataset, transform=decode, root="train")
    val = DLFSDataset(args.server, args.dataset, transform=decode, root="val")
    print(f"train: {len(train)} samples, classes {train.classes}; val: {len(val)} samples")
    sampler = ShuffleShardSampler(len(train), seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)
    val_loader = DataLoader(val, batch_size=256, num_workers=args.workers)
    model = tiny_cnn()
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()

    with Timeline(args.trace) as timeline:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            model.train()
            total, correct, loss_sum = 0, 0, 0.0
            for images, labels in timeline.wrap(loader, label=f"epoch {epoch}"):
                with timeline.step():
                    optimiser.zero_grad()
                    logits = model(images)
                    loss = loss_fn(logits, labels)
                    loss.backward()
                    optimiser.step()
                total += len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                loss_sum += loss.item() * len(labels)
            accuracy = evaluate(model, val_loader)
            print(f"epoch {epoch}: loss {loss_sum / total:.3f}  train accuracy "
                  f"{correct / total:.1%}  val accuracy {accuracy:.1%}")
    return 0


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = correct = 0
    for images, labels in loader:
        correct += int((model(images).argmax(1) == labels).sum())
        total += len(labels)
    return correct / total


if __name__ == "__main__":
    sys.exit(main())
