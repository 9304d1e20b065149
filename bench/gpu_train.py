"""Does the loader keep a GPU busy?  Real training steps, four ways to feed them, one run.

    source .device/setup.sh && python3 -m bench.gpu_train          # the 16-core GPU machine
    python -m bench.gpu_train --quick                               # CPU form, tiny sizes

On the same generated JPEGs (500 x 375, about 110 KB, ImageFolder layout,
ingested into a daemon started here), one model (torchvision's resnet50,
bf16 autocast, channels-last, SGD; ``--model tiny`` a small CNN) trains a
fixed number of steps fed by:

- ``compute``: one batch already on the device, over and over: the ceiling;
- ``imagefolder-cpu``: ``torchvision.datasets.ImageFolder`` on the ext4 tree
  in a ``DataLoader(num_workers=W, pin_memory=True)``, each image decoded
  and cropped by the workers (RandomResizedCrop and a flip, then uint8;
  normalised on the device);
- ``dlfs-cpu``: the same transform and DataLoader over `dlfs.torch.DLFSDataset`
  (over loopback TCP, as a remote node reads; ``--direct`` co-located);
- ``dlfs-gpu``: ``ReadAhead(stack=False)`` (a helper process reads the
  encoded batches into pinned shared memory) in a DataLoader without
  workers, and `dlfs.torch.DecodedBatches`: every JPEG of a batch decoded
  together by nvJPEG, cropped, mirrored and normalised in one pass on a
  side stream while the previous step runs.

Each row runs ``--warmup`` steps, then ``--steps`` timed ones; every step
ends with ``loss.item()`` (a sync, as a training loop that logs its loss
has), so the time a step waits for its batch is the time ``next()`` takes.
Reported per row: images/s, utilisation (images/s over the ``compute``
row's: the share of the GPU's pace the loader sustains) and the wait per
step.  Without torchvision (the CPU torch build of the development VM) the
CPU rows use the same crop rule with Pillow, and the model must be
``tiny``.  ``--trace DIR`` writes a ``torch.profiler`` trace of a few
``dlfs-gpu`` steps in which DLFS's ``dlfs.fetch`` / ``dlfs.decode`` /
``dlfs.augment`` ranges sit beside the GPU's kernels (they are NVTX ranges
too, for Nsight Systems).

Results: markdown on stdout, JSON (``--out``, rewritten after every row) with
the plan, the machine and the git revision.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import itertools
import json
import multiprocessing
import os
import sys
import time

import numpy as np

from bench import processes
from bench.train_bench import ensure_dataset, machine

CLASSES = 10
ROWS = ("compute", "imagefolder-cpu", "dlfs-cpu", "dlfs-gpu")
# Std of the noise on the generated pictures: 24 gives JPEGs of about 110 KB at
# 500 x 375, quality 90, like ImageNet's average.
NOISE_STD = 24.0


@dataclasses.dataclass(frozen=True)
class Plan:
    images: int
    width: int
    height: int
    batch_size: int
    warmup: int
    steps: int
    workers: int
    model: str
    size: int
    device: str
    rows: tuple[str, ...] = ROWS


FULL = Plan(images=12000, width=500, height=375, batch_size=256, warmup=8, steps=40, workers=14,
            model="resnet50", size=224, device="cuda")
QUICK = Plan(images=96, width=64, height=48, batch_size=8, warmup=1, steps=4, workers=2,
             model="tiny", size=32, device="cpu")


# --- data ---------------------------------------------------------------------------

def _picture(args) -> None:
    path, seed, width, height = args
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6, size=3)
    base = np.stack([128 + 60 * np.sin(x / (17 + 5 * c) + y / (23 + 3 * c) + phase[c])
                     for c in range(3)], -1)
    pixels = np.clip(base + rng.normal(0, NOISE_STD, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", quality=90)


def prepare_jpegs(root: str, plan: Plan) -> str:
    """`plan.images` JPEGs in class folders under `root`; reused when present."""
    tree = os.path.join(root, f"jpegs-{plan.images}-{plan.width}x{plan.height}")
    marker = os.path.join(tree, ".ready")
    if os.path.exists(marker):
        return tree
    jobs = []
    for i in range(plan.images):
        folder = os.path.join(tree, f"class{i % CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        jobs.append((os.path.join(folder, f"{i:07d}.jpg"), i, plan.width, plan.height))
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        pool.map(_picture, jobs, chunksize=64)
    os.sync()
    with open(marker, "w") as f:
        f.write("ok\n")
    return tree


# --- the CPU transform of the worker-based rows ------------------------------------------

class CpuCrop:
    """A sample (bytes, memoryview or an open file's contents) to a cropped [3, S, S] uint8
    tensor: decode, RandomResizedCrop, flip; torchvision's transforms when it imports, else
    the same rule with Pillow.  Picklable (it runs in DataLoader workers)."""

    def __init__(self, size: int):
        self.size = size
        self._torchvision = None

    def __call__(self, sample):
        import torch
        from PIL import Image

        image = Image.open(io.BytesIO(sample)).convert("RGB")
        transforms = self._transforms()
        if transforms is not None:
            return transforms(image)
        from dlfs.torch.image_augment import random_resized_crop_boxes

        box = random_resized_crop_boxes(torch.tensor([[image.height, image.width]]))
        top, left = int(box.top[0]), int(box.left[0])
        image = image.resize((self.size, self.size), Image.BILINEAR,
                             box=(left, top, left + int(box.width[0]), top + int(box.height[0])))
        if bool(box.flip[0]):
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)

    def _transforms(self):
        if self._torchvision is None:
            try:
                from torchvision import transforms
            except (ImportError, RuntimeError):
                self._torchvision = False
            else:
                self._torchvision = transforms.Compose([
                    transforms.RandomResizedCrop(self.size), transforms.RandomHorizontalFlip(),
                    transforms.PILToTensor()])
        return self._torchvision or None


def folder_dataset(tree: str, transform):
    """torchvision's ImageFolder, or (without torchvision) the same listing and labels."""
    try:
        from torchvision.datasets import ImageFolder

        return ImageFolder(tree, loader=_read_bytes, transform=transform)
    except (ImportError, RuntimeError):
        pass
    from torch.utils.data import Dataset

    class Folder(Dataset):
        def __init__(self):
            classes = sorted(e.name for e in os.scandir(tree) if e.is_dir())
            self.samples = [(os.path.join(tree, c, f), i) for i, c in enumerate(classes)
                            for f in sorted(os.listdir(os.path.join(tree, c)))]

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, index):
            path, label = self.samples[index]
            return transform(_read_bytes(path)), label

    return Folder()


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --- training -----------------------------------------------------------------------

class Trainer:
    """The model, its optimiser and one training step; normalises uint8 batches itself."""

    def __init__(self, plan: Plan, classes: int):
        import torch
        from torch import nn

        from dlfs.torch.image_augment import IMAGENET_MEAN, IMAGENET_STD

        self.torch = torch
        self.device = torch.device(plan.device)
        self.cuda = self.device.type == "cuda"
        if plan.model == "tiny":
            model = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                nn.Flatten(), nn.Linear(32, classes))
        else:
            import torchvision

            model = getattr(torchvision.models, plan.model)(num_classes=classes)
        self.model = model.to(self.device, memory_format=torch.channels_last)
        self.optimiser = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        self.mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1) * 255

    def step(self, images, labels) -> float:
        torch = self.torch
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = ((images.float() - self.mean) / self.std).contiguous(
                memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = self.loss(self.model(images), labels)
        self.optimiser.zero_grad(set_to_none=True)
        loss.backward()
        self.optimiser.step()
        return loss.item()  # a sync per step, as a loop that logs its loss has


@dataclasses.dataclass
class RowResult:
    row: str
    images: int
    wall_s: float
    wait_s: float
    steps: int
    note: str = ""

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s

    def as_dict(self, compute: "RowResult | None") -> dict:
        return dataclasses.asdict(self) | {
            "images_per_s": self.images_per_s,
            "wait_ms_per_step": 1000 * self.wait_s / self.steps,
            "utilisation": self.images_per_s / compute.images_per_s if compute else None}


def timed(row: str, trainer: Trainer, batches, plan: Plan, note: str = "") -> RowResult:
    """Warm-up steps, then `plan.steps` timed ones from the endless iterator `batches`."""
    for _ in range(plan.warmup):
        trainer.step(*next(batches))
    if trainer.cuda:
        trainer.torch.cuda.synchronize()
    images = 0
    wait = 0.0
    started = time.perf_counter()
    for _ in range(plan.steps):
        asked = time.perf_counter()
        batch_images, labels = next(batches)
        wait += time.perf_counter() - asked
        trainer.step(batch_images, labels)
        images += len(labels)
    wall = time.perf_counter() - started
    return RowResult(row, images, wall, wait, plan.steps, note)


def endless(loader, sampler):
    """Batches of `loader` across epochs, the sampler's epoch advanced each time."""
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def run_row(row: str, plan: Plan, env: dict, trainer: Trainer) -> RowResult:
    import torch
    from torch.utils.data import DataLoader

    from dlfs.torch import DecodedBatches, DLFSDataset, ReadAhead, ShuffleShardSampler

    cuda = trainer.cuda
    if row == "compute":
        images = torch.randn(plan.batch_size, 3, plan.size, plan.size, device=trainer.device
                             ).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, CLASSES, (plan.batch_size,), device=trainer.device)
        return timed(row, trainer, itertools.repeat((images, labels)), plan)
    workers = dict(num_workers=plan.workers, pin_memory=cuda, persistent_workers=True,
                   prefetch_factor=4, timeout=300)
    if row == "imagefolder-cpu":
        ds = folder_dataset(env["tree"], CpuCrop(plan.size))
        sampler = ShuffleShardSampler(len(ds), seed=1)
        loader = DataLoader(ds, batch_size=plan.batch_size, sampler=sampler, drop_last=True,
                            **workers)
        return timed(row, trainer, endless(loader, sampler), plan,
                     "torchvision" if CpuCrop(plan.size)._transforms() else "Pillow crop")
    options = {"direct": True} if env["direct"] else {"data_path": "tcp"}
    if row == "dlfs-cpu":
        ds = DLFSDataset(env["address"], env["name"], transform=CpuCrop(plan.size),
                         client_options=options)
        sampler = ShuffleShardSampler(len(ds), seed=1)
        loader = DataLoader(ds, batch_size=plan.batch_size, sampler=sampler, drop_last=True,
                            **workers)
        return timed(row, trainer, endless(loader, sampler), plan)
    if row == "dlfs-gpu":
        ds = DLFSDataset(env["address"], env["name"], client_options=options)
        sampler = ShuffleShardSampler(len(ds), seed=1)
        read_ahead = ReadAhead(sampler, ds, batch_size=plan.batch_size, batches=4,
                               drop_last=True, stack=False)
        batches = DecodedBatches(DataLoader(ds, batch_size=None, sampler=read_ahead),
                                 device=trainer.device, size=plan.size, train=True,
                                 backend=env["decoder"],
                                 dtype=torch.bfloat16 if cuda else torch.float32)
        try:
            result = timed(row, trainer, endless(batches, read_ahead), plan,
                           f"decoder {batches.decoder.backend}")
            if env["trace"]:
                write_trace(env["trace"], trainer, endless(batches, read_ahead))
            return result
        finally:
            read_ahead.close()
            batches.close()
    raise ValueError(f"unknown row {row}")


def write_trace(directory: str, trainer: Trainer, batches) -> None:
    """A torch.profiler trace of a few steps, DLFS's ranges (every thread) beside the kernels."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if trainer.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    options = {}
    try:
        options["experimental_config"] = torch._C._profiler._ExperimentalConfig(
            profile_all_threads=True)
    except (AttributeError, TypeError):
        pass  # older torch: only the training thread's ranges
    os.makedirs(directory, exist_ok=True)
    with torch.profiler.profile(activities=activities, **options) as prof:
        for _ in range(4):
            trainer.step(*next(batches))
    prof.export_chrome_trace(os.path.join(directory, "gpu_train_dlfs_gpu.json"))


# --- report -------------------------------------------------------------------------------

TITLES = {"compute": "pure compute (one batch on the device)",
          "imagefolder-cpu": "ImageFolder + CPU decode (DataLoader workers)",
          "dlfs-cpu": "DLFSDataset + CPU decode (DataLoader workers)",
          "dlfs-gpu": "DLFS ReadAhead + GPU decode (DecodedBatches)"}


def markdown(results: list[dict], plan: Plan, env: dict) -> str:
    lines = [f"GPU training feed: {plan.model}, batch {plan.batch_size}, {plan.size} px, "
             f"{plan.images} JPEGs of {plan.width}x{plan.height} (mean {env['jpeg_bytes']:,} B), "
             f"device {env['device_name']}, {plan.workers} DataLoader workers, "
             f"{plan.steps} timed steps after {plan.warmup}.", "",
             "| feed | images/s | utilisation (of pure compute) | wait per step | note |",
             "| --- | ---: | ---: | ---: | --- |"]
    for r in results:
        utilisation = f"{r['utilisation']:.0%}" if r["utilisation"] is not None else "-"
        lines.append(f"| {TITLES[r['row']]} | {r['images_per_s']:,.0f} | {utilisation} | "
                     f"{r['wait_ms_per_step']:.1f} ms | {r['note']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU form, tiny sizes (seconds)")
    parser.add_argument("--data-dir", default="/var/tmp/dlfs-gpu-train",
                        help="generated JPEGs, the daemon's data dir and log (reused)")
    parser.add_argument("--out", default="", help="write results JSON here (after every row)")
    parser.add_argument("--rows", default="", help="comma-separated subset of " + ",".join(ROWS))
    for field in ("images", "batch_size", "steps", "warmup", "workers", "size"):
        parser.add_argument("--" + field.replace("_", "-"), type=int)
    parser.add_argument("--model", help="resnet50 (torchvision) or tiny")
    parser.add_argument("--device", help="cuda or cpu")
    parser.add_argument("--decoder", default="auto", help="auto, nvjpeg, dali or pillow")
    parser.add_argument("--direct", action="store_true", help="DLFS rows read co-located")
    parser.add_argument("--trace", default="", help="write a profiler trace of dlfs-gpu here")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    changes = {f: getattr(args, f) for f in ("images", "batch_size", "steps", "warmup", "workers",
                                             "size", "model", "device")
               if getattr(args, f) is not None}
    if args.rows:
        unknown = set(args.rows.split(",")) - set(ROWS)
        if unknown:
            parser.error(f"unknown rows {', '.join(sorted(unknown))}")
        changes["rows"] = tuple(r for r in ROWS if r in args.rows.split(","))
    plan = dataclasses.replace(plan, **changes)
    if plan.images < plan.batch_size:
        parser.error(f"--images {plan.images} is fewer than one batch of {plan.batch_size}")

    import torch

    if plan.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: pass --device cpu (and --model tiny), or --quick")

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    os.makedirs(args.data_dir, exist_ok=True)
    tree = prepare_jpegs(args.data_dir, plan)
    sizes = [e.stat().st_size for c in os.scandir(tree) if c.is_dir() for e in os.scandir(c)]
    progress(f"gpu_train: {len(sizes)} JPEGs ready ({time.monotonic() - started:.0f} s)")
    env = {"tree": tree, "direct": args.direct, "decoder": args.decoder, "trace": args.trace,
           "jpeg_bytes": int(np.mean(sizes)),
           "device_name": torch.cuda.get_device_name() if plan.device == "cuda" else "cpu"}
    results: list[dict] = []
    compute = None
    with processes.daemon(os.path.join(args.data_dir, "dlfs"),
                          os.path.join(args.data_dir, "daemon.log")) as daemon:
        name = f"gpu-train-{plan.images}-{plan.width}x{plan.height}"
        ensure_dataset(daemon.address, tree, name, plan.images)
        env.update(address=daemon.address, name=name)
        progress(f"gpu_train: dataset {name} ingested ({time.monotonic() - started:.0f} s)")
        trainer = Trainer(plan, CLASSES)
        for row in plan.rows:
            result = run_row(row, plan, env, trainer)
            gc.collect()  # the row's DataLoader workers end before the next row starts
            compute = result if row == "compute" else compute
            results.append(result.as_dict(compute))
            progress(f"gpu_train: {row:<16} {result.images_per_s:9.0f} images/s, wait "
                     f"{results[-1]['wait_ms_per_step']:.1f} ms/step "
                     f"({time.monotonic() - started:.0f} s)")
            if args.out:
                _write(args.out, plan, env, results, started)
    report = markdown(results, plan, env)
    print(report)
    if args.out:
        _write(args.out, plan, env, results, started, report)
    progress(f"gpu_train: done in {time.monotonic() - started:.0f} s")
    return 0


def _write(path: str, plan: Plan, env: dict, results: list[dict], started: float,
           report: str = "") -> None:
    with open(path, "w") as f:
        json.dump({"plan": dataclasses.asdict(plan), "machine": machine(),
                   "device": env["device_name"], "jpeg_bytes_mean": env["jpeg_bytes"],
                   "elapsed_s": time.monotonic() - started, "results": results,
                   "markdown": report}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
