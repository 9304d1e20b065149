"""`DecodedBatches`: encoded batches decoded and augmented on the GPU while the step runs.

    read_ahead = ReadAhead(sampler, ds, batch_size=256, stack=False)
    loader = StatefulDataLoader(ds, batch_size=None, sampler=read_ahead)   # or DataLoader
    batches = DecodedBatches(loader, device="cuda", size=224)
    for images, labels in batches:       # [256, 3, 224, 224] float, normalised, on the GPU
        step(images, labels)

One thread of the training process (not a process: the work is GPU calls
and copies, which release the GIL) pulls each batch of encoded samples from
the loader, makes sure their bytes are in pinned memory (the read-ahead
ring is registered with CUDA once, so a batch is pinned where the helper
process received it; other loaders' batches are copied into one pinned
staging buffer), decodes the JPEGs together (`ImageDecoder`), crops,
resizes, mirrors and normalises the batch in one pass (`crop_resize`), all
on a CUDA stream of its own, and queues the result with an event.  The
training thread waits only for that event: the decode of batch k+1 overlaps
step k on the GPU, and the host work overlaps too.  ``ahead`` bounds the
batches decoded in advance (GPU memory: ahead + 1 batches of
``B x 3 x size x size`` floats).

The fetch and the decode steps are named ranges (``dlfs.fetch``,
``dlfs.pin``, ``dlfs.decode``, ``dlfs.augment``) for ``torch.profiler``
and, on a GPU, NVTX (Nsight Systems), so they show beside the kernels.

On a CPU device (no GPU, or tests) the same code runs with Pillow decoding
and the batched crop on the CPU: slower, same results.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import queue
import threading
import time
from typing import Iterator, Sequence

import torch

from dlfs import limits
from dlfs.errors import InvalidArgument
from dlfs.torch.image_augment import (IMAGENET_MEAN, IMAGENET_STD, CropBoxes, center_crop_boxes,
                                      crop_resize, image_sizes, random_resized_crop_boxes)
from dlfs.torch.image_decode import ImageDecoder
from dlfs.training.checks import check_int

# How often a blocked hand-over looks whether the consumer has gone (seconds).
_HANDOVER_POLL_S = 0.1


@dataclasses.dataclass
class DecodeStats:
    """Counters of one `DecodedBatches` (read them during or after iteration).

    Host seconds on the decode thread: ``fetch_s`` waiting for the loader's
    next batch, ``decode_s`` pinning, decoding and augmenting (GPU work is
    queued, not waited for).  ``wait_s``: what the training thread waited
    in ``next()`` (the step's stall).
    """

    batches: int = 0
    images: int = 0
    wait_s: float = 0.0
    fetch_s: float = 0.0
    decode_s: float = 0.0


class DecodedBatches:
    """Decoded, augmented batches on `device`, one decode thread ahead of the training loop.

    ``DecodedBatches(loader, *, device="cuda", size=224, train=True, backend="auto",
    ahead=2, seed=0, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=torch.float32,
    channels_last=True)``

    `loader` yields ``(samples, labels)`` with ``samples`` a list of 1-D
    uint8 CPU tensors, one encoded image each (``ReadAhead(..., stack=False)``
    in a DataLoader with ``batch_size=None``), or samples alone.  Yields
    ``(images, labels)``: images ``[B, 3, size, size]`` of `dtype` on `device`
    (channels-last), labels moved there too.  `train`: RandomResizedCrop
    boxes and random mirroring, drawn from a generator seeded with ``seed +
    epoch`` where epoch counts the iterations (pass `seed` per rank);
    otherwise the centred crop (`center_crop_boxes`).  A batch (and the
    memory behind it) is the caller's until dropped.

    Resuming: `state_dict` is the loader's state after the batches handed
    out so far (not those decoded ahead), taken from ``loader.state_dict()``
    (StatefulDataLoader) or else from the loader's sampler (a `ReadAhead`
    in a plain DataLoader without workers); `load_state_dict` passes a
    state back to the same place.

    The augmentation's random draws are not part of the state: a resumed
    iteration crops the remaining images differently than the uninterrupted
    one would have.

    Leaving an iteration early (``break``, an exception) stops the thread;
    an error of the loader or the decoder is raised at its batch.  Raises
    InvalidArgument for bad arguments, and for a loader batch that is not
    a list of encoded samples.
    """

    def __init__(self, loader, *, device="cuda", size: int = 224, train: bool = True,
                 backend: str = "auto", ahead: int = 2, seed: int = 0,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 dtype: torch.dtype = torch.float32, channels_last: bool = True):
        self.size = check_int("size", size, 1, limits.decoded_image_side_max)
        self.ahead = check_int("ahead", ahead, 1, limits.decode_ahead_batches_max)
        self.loader = loader
        self.device = torch.device(device)
        self.decoder = ImageDecoder(self.device, backend)
        self.train = train
        self.seed = int(seed)
        self.mean, self.std = tuple(mean), tuple(std)
        self.dtype = dtype
        self.channels_last = channels_last
        self.stats = DecodeStats()
        self._iterations = 0
        self._state = None
        self._pinned = _PinnedMemory(self.device)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self):
        """The loader's state after the batches handed out (module doc).  Raises
        InvalidArgument when the loader keeps no position."""
        source = _state_source(self.loader)
        return self._state if self._state is not None else source.state_dict()

    def load_state_dict(self, state) -> None:
        """Resume where `state` (from `state_dict`) left off, at the next iteration."""
        _state_source(self.loader).load_state_dict(state)
        self._state = None

    def close(self) -> None:
        """Forget the pinned registrations (the read-ahead ring stays the sampler's)."""
        self._pinned.release()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self._iterations)
        self._iterations += 1
        source = _state_source(self.loader, required=False)
        # Taken here, before the decode thread touches the loader: the state until a batch is out.
        self._state = source.state_dict() if source is not None else None
        self.stats = DecodeStats()
        return self._handed_out(_DecodeThread(self, generator))

    def _handed_out(self, worker: "_DecodeThread"):
        worker.start()
        try:
            while True:
                started = time.perf_counter()
                item = worker.take()
                if item is None:
                    return
                images, labels, event, state = item
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    # The side stream's allocations are now also in use on this stream.
                    images.record_stream(current)
                    if isinstance(labels, torch.Tensor) and labels.device.type == "cuda":
                        labels.record_stream(current)
                self._state = state
                self.stats.wait_s += time.perf_counter() - started
                self.stats.batches += 1
                self.stats.images += len(images)
                yield (images, labels) if labels is not None else images
        finally:
            worker.stop()

    # --- on the decode thread ------------------------------------------------------

    def _boxes(self, images: list[torch.Tensor], generator: torch.Generator) -> CropBoxes:
        sizes = image_sizes(images)
        if self.train:
            return random_resized_crop_boxes(sizes, generator=generator)
        return center_crop_boxes(sizes)

    def _prepare(self, samples, generator: torch.Generator) -> torch.Tensor:
        """One batch of encoded samples to the finished image batch (on the current stream)."""
        if not isinstance(samples, (list, tuple)) or not all(
                isinstance(s, torch.Tensor) and s.dtype == torch.uint8 and s.dim() == 1
                for s in samples):
            raise InvalidArgument(
                "DecodedBatches takes batches of encoded images as lists of 1-D uint8 tensors: "
                "DataLoader(ds, batch_size=None, sampler=ReadAhead(..., stack=False))")
        with named_range("dlfs.pin"):
            samples = self._pinned.pinned(samples)
        with named_range("dlfs.decode"):
            images = self.decoder.decode(samples)
        with named_range("dlfs.augment"):
            return crop_resize(images, self._boxes(images, generator), self.size,
                               mean=self.mean, std=self.std, dtype=self.dtype,
                               channels_last=self.channels_last)


class _DecodeThread:
    """The thread that runs one iteration of the loader through the decoder."""

    def __init__(self, owner: DecodedBatches, generator: torch.Generator):
        self.owner = owner
        self.generator = generator
        self.handover: queue.Queue = queue.Queue(maxsize=owner.ahead)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dlfs-decode", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def take(self):
        """The next ``(images, labels, event, state)``, None at the end; raises the thread's
        error at its batch."""
        while True:
            try:
                item = self.handover.get(timeout=_HANDOVER_POLL_S)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.handover.empty():
                    return None
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def _put(self, item) -> bool:
        while not self.stopping.is_set():
            try:
                self.handover.put(item, timeout=_HANDOVER_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        owner = self.owner
        cuda = owner.device.type == "cuda"
        stream = torch.cuda.Stream(owner.device) if cuda else None
        source = _state_source(owner.loader, required=False)
        # Batches whose encoded bytes the GPU may still be reading, with the event that says
        # when it is done: their memory (a read-ahead slot) is not given back before.
        held: collections.deque = collections.deque()
        try:
            iterator = iter(owner.loader)
            while not self.stopping.is_set():
                while held and held[0][0].query():
                    held.popleft()
                started = time.perf_counter()
                with named_range("dlfs.fetch"):
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        return
                # The loader's state now counts this batch: it is the state once it is trained on.
                state = source.state_dict() if source is not None else None
                decoding = time.perf_counter()
                owner.stats.fetch_s += decoding - started
                samples, labels = batch if isinstance(batch, (tuple, list)) and len(batch) == 2 \
                    and isinstance(batch[0], (list, tuple)) else (batch, None)
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    images = owner._prepare(samples, self.generator)
                    if labels is not None and cuda:
                        labels = labels.pin_memory().to(owner.device, non_blocking=True)
                    event = torch.cuda.Event() if cuda else None
                    if event is not None:
                        event.record(stream)
                owner.stats.decode_s += time.perf_counter() - decoding
                if event is not None:
                    held.append((event, batch))
                del samples, batch  # on the CPU the decode is done: the slot can go back
                if not self._put((images, labels, event, state)):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised on the training thread, at its batch
            self._put(exc)


def named_range(name: str):
    """A ``torch.profiler.record_function`` range, and an NVTX range when CUDA is there."""
    ranges = contextlib.ExitStack()
    ranges.enter_context(torch.profiler.record_function(name))
    if torch.cuda.is_available():
        ranges.enter_context(torch.cuda.nvtx.range(name))
    return ranges


def _state_source(loader, required: bool = True):
    """What holds the loader's position: the loader (StatefulDataLoader) or its sampler."""
    for candidate in (loader, getattr(loader, "batch_sampler", None),
                      getattr(loader, "sampler", None)):
        if candidate is not None and hasattr(candidate, "state_dict") \
                and hasattr(candidate, "load_state_dict"):
            return candidate
    if required:
        raise InvalidArgument(
            f"{type(loader).__name__} keeps no position to save: use torchdata's "
            "StatefulDataLoader, or a DataLoader whose sampler is a ReadAhead")
    return None


class _PinnedMemory:
    """Encoded batches in page-locked memory, so the decoder's copy to the GPU is one DMA.

    Samples that are views of a memory region registered here (the
    read-ahead ring, registered whole the first time one of its batches is
    seen) are used as they are; others are copied into one pinned staging
    buffer, grown as needed.  Nothing happens on a CPU device.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.regions: list[tuple[int, int, object]] = []  # (start, end, mapping kept alive)
        self.staging: torch.Tensor | None = None
        self.refused: set[int] = set()  # starts of regions CUDA would not register: staged

    def pinned(self, samples: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.device.type != "cuda" or not samples:
            return samples
        first = min(s.data_ptr() for s in samples)
        last = max(s.data_ptr() + s.numel() for s in samples)
        if any(start <= first and last <= end for start, end, _ in self.regions):
            return samples
        region = _ring_region(samples[0])
        if region is not None and region[0] not in self.refused:
            start, end, _mapping = region
            cudart = torch.cuda.cudart()
            if cudart.cudaHostRegister(start, end - start, 0) == cudart.cudaError.success:
                self.regions.append(region)
                return samples
            self.refused.add(start)  # page-locking refused (a locked-memory limit?)
        sizes = [s.numel() for s in samples]
        total = sum(sizes)
        if self.staging is None or self.staging.numel() < total:
            self.staging = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=True)
        # The previous batch's decode may still read the staging buffer: wait for it.
        torch.cuda.current_stream(self.device).synchronize()
        torch.cat(samples, out=self.staging[:total])
        return list(torch.split(self.staging[:total], sizes))

    def release(self) -> None:
        for start, _end, _owner in self.regions:
            torch.cuda.cudart().cudaHostUnregister(start)
        self.regions.clear()


def _ring_region(sample: torch.Tensor):
    """(start, end, owner) of the read-ahead ring `sample` is a view of, else None."""
    from dlfs.ring import BatchRing

    return BatchRing.region_of(sample.data_ptr())
