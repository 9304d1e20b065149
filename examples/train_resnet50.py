"""Train torchvision's resnet50 on an ImageFolder-style JPEG dataset read through DLFS.

    dlfs ingest /data/imagenet imagenet                 # train/<class>/*.JPEG
    python examples/train_resnet50.py --server 127.0.0.1:7010 --dataset imagenet --root train \\
        --checkpoint /ckpt/resnet50.pt
    torchrun --nproc-per-node 8 examples/train_resnet50.py ... --elastic     # DDP, one GPU a rank

Needs torch with CUDA and torchvision for the model (``--model tiny`` trains a
small CNN instead and needs neither, which is how the tests run it on a CPU).

The data path (docs/training.md, "Decoding on the GPU"):

1. `ShuffleShardSampler`: this rank's share of a fresh permutation per epoch
   (with ``--elastic``, one state for the whole job, resumable at any world
   size);
2. `ReadAhead(stack=False)`: a helper process reads the next batches of
   encoded JPEGs into a ring of shared memory, which `DecodedBatches`
   registers with CUDA once (pinned: the decoder's copy is a DMA);
3. torchdata's `StatefulDataLoader` around it, so the position inside the
   epoch is part of the checkpoint;
4. `DecodedBatches`: each batch's JPEGs decoded together by nvJPEG, cropped
   (RandomResizedCrop), mirrored and normalised in one pass, on a CUDA
   stream of its own while the previous step trains.

Every ``--checkpoint-every`` steps rank 0 writes model, optimiser, epoch and
the loader's state; a restarted job (any world size with ``--elastic``)
continues the epoch where the checkpoint left it.  ``--max-steps`` stops
after that many steps (with a checkpoint), to try the resume.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from dlfs.torch import DecodedBatches, DLFSDataset, ReadAhead, ShuffleShardSampler


def tiny_cnn(classes: int) -> nn.Module:
    """A small CNN for CPU runs and tests (no torchvision needed)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, classes))


def make_model(name: str, classes: int) -> nn.Module:
    if name == "tiny":
        return tiny_cnn(classes)
    import torchvision

    return torchvision.models.resnet50(num_classes=classes)


def distributed_setup(device_arg: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group torchrun describes, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_arg == "auto":
        device_arg = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(f"cuda:{local_rank}" if device_arg == "cuda" else device_arg)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world_size, device


def save_checkpoint(path: str, model, optimiser, schedule, epoch: int,
                    batches: DecodedBatches) -> None:
    """Atomically write what a restart needs: weights, optimiser, epoch, loader position."""
    state = {"model": model.state_dict(), "optimiser": optimiser.state_dict(),
             "schedule": schedule.state_dict(), "epoch": epoch, "loader": batches.state_dict()}
    temporary = path + ".tmp"
    torch.save(state, temporary)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get("DLFS_SERVER", "127.0.0.1:7010"))
    parser.add_argument("--dataset", default="imagenet")
    parser.add_argument("--root", default="train", help="the image folder inside the dataset")
    parser.add_argument("--model", default="resnet50", choices=("resnet50", "tiny"))
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=256, help="per rank")
    parser.add_argument("--size", type=int, default=224, help="crop side in pixels")
    parser.add_argument("--lr", type=float, default=0.1, help="for a batch of 256 in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--decoder", default="auto", help="auto, nvjpeg, dali or pillow")
    parser.add_argument("--read-ahead", type=int, default=4, help="batches read ahead")
    parser.add_argument("--elastic", action="store_true",
                        help="an order and checkpoint that resume at any world size")
    parser.add_argument("--checkpoint", default="", help="file to save to and resume from")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    args = parser.parse_args(argv)

    rank, world_size, device = distributed_setup(args.device)
    torch.manual_seed(args.seed)
    cuda = device.type == "cuda"
    ds = DLFSDataset(args.server, args.dataset, root=args.root)
    sampler = ShuffleShardSampler(len(ds), seed=args.seed, rank=rank, world_size=world_size,
                                  drop_last=True, elastic=args.elastic)
    read_ahead = ReadAhead(sampler, ds, batch_size=args.batch_size, batches=args.read_ahead,
                           drop_last=True, stack=False)
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(ds, batch_size=None, sampler=read_ahead)
    batches = DecodedBatches(loader, device=device, size=args.size, train=True,
                             backend=args.decoder, seed=args.seed + 1000 * rank)

    model = make_model(args.model, len(ds.classes)).to(device, memory_format=torch.channels_last)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None)
    lr = args.lr * args.batch_size * world_size / 256
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    steps_per_epoch = max(len(read_ahead), 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.5 * (1 + math.cos(math.pi * step / (args.epochs
                                                                       * steps_per_epoch))))
    loss_fn = nn.CrossEntropyLoss()

    start_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device, weights_only=False)
        target = model.module if world_size > 1 else model
        target.load_state_dict(saved["model"])
        optimiser.load_state_dict(saved["optimiser"])
        schedule.load_state_dict(saved["schedule"])
        start_epoch = saved["epoch"]
        batches.load_state_dict(saved["loader"])
        if rank == 0:
            print(f"resumed from {args.checkpoint} in epoch {start_epoch}", flush=True)

    step = 0
    try:
        for epoch in range(start_epoch, args.epochs):
            read_ahead.set_epoch(epoch)
            model.train()
            started, images_seen, loss_sum = time.perf_counter(), 0, 0.0
            for images, labels in batches:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    loss = loss_fn(model(images), labels)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                schedule.step()
                images_seen += len(labels)
                loss_sum += loss.item() * len(labels)
                step += 1
                stop = args.max_steps and step >= args.max_steps
                if args.checkpoint and rank == 0 and (stop or step % args.checkpoint_every == 0):
                    target = model.module if world_size > 1 else model
                    save_checkpoint(args.checkpoint, target, optimiser, schedule, epoch,
                                    batches)
                if stop:
                    break
            wall = time.perf_counter() - started
            if rank == 0:
                print(json.dumps({"epoch": epoch, "images": images_seen * world_size,
                                  "loss": loss_sum / max(images_seen, 1),
                                  "images_per_s": images_seen * world_size / wall,
                                  "wait_s": round(batches.stats.wait_s, 3)}), flush=True)
            if args.max_steps and step >= args.max_steps:
                break
    finally:
        read_ahead.close()
        batches.close()
        if world_size > 1:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
