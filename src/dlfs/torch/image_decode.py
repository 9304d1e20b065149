"""`ImageDecoder`: a batch of encoded images to pixels, the JPEGs together on the GPU.

    decoder = ImageDecoder("cuda")                  # nvJPEG through torchvision
    images = decoder.decode(samples)                # samples: 1-D uint8 CPU tensors
    # images: list of [3, H, W] uint8 tensors on the device, one per sample

Backends:

- ``"nvjpeg"``: every JPEG of the batch in one
  ``torchvision.io.decode_jpeg(list, device="cuda")`` call (nvJPEG's batched
  decoder); torchvision reads the encoded bytes from host memory (pinned
  memory makes its copy a DMA), so the samples stay CPU tensors;
- ``"dali"``: NVIDIA DALI's ``fn.decoders.image(device="mixed")`` (which uses
  the hardware JPEG decoders of A100/H100/H200 where there are), when
  ``nvidia.dali`` is installed;
- ``"pillow"``: Pillow on the CPU, one sample at a time (what a machine
  without a GPU, or torchvision, runs).

``"auto"`` picks nvjpeg on a CUDA device when torchvision imports, else
pillow.  Whatever the backend, a sample that is not a JPEG (PNG, WebP, ...)
is decoded by Pillow on the CPU and moved to the device: the GPU decoders
here take JPEG only.  torchvision is imported only by the nvjpeg backend
(PyPI's torchvision does not import beside the CPU build of torch).
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np
import torch

from dlfs.errors import FailedPrecondition, InvalidArgument

JPEG_MAGIC = b"\xff\xd8\xff"
BACKENDS = ("auto", "nvjpeg", "dali", "pillow")


def is_jpeg(sample: torch.Tensor) -> bool:
    """Whether the encoded sample (1-D uint8) starts like a JPEG file (SOI marker)."""
    return sample.numel() >= 3 and bytes(sample[:3].tolist()) == JPEG_MAGIC


def pillow_decode(sample: torch.Tensor) -> torch.Tensor:
    """One encoded image (any format Pillow reads) as a ``[3, H, W]`` uint8 CPU tensor, RGB.

    Raises InvalidArgument when Pillow cannot read it.  Cost: one decode on
    the calling thread (Pillow releases the GIL while it decodes).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(memoryview(sample.numpy()))) as image:
            pixels = np.array(image.convert("RGB"))  # writable, as torch wants
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidArgument(f"a sample of {sample.numel()} bytes is not an image Pillow can "
                              f"decode ({exc}); is the dataset's root the image folder?") from None
    return torch.from_numpy(pixels).permute(2, 0, 1)


class ImageDecoder:
    """Decode batches of encoded images on `device` with one backend (module doc).

    ``ImageDecoder(device="cuda", backend="auto")``.  Raises InvalidArgument
    for an unknown backend, FailedPrecondition when the backend asked for
    cannot run here (nvjpeg or dali on a CPU device, or not installed).
    """

    def __init__(self, device="cpu", backend: str = "auto"):
        if backend not in BACKENDS:
            raise InvalidArgument(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        if backend == "auto":
            backend = "nvjpeg" if cuda and _torchvision_io() is not None else "pillow"
        if backend in ("nvjpeg", "dali") and not cuda:
            raise FailedPrecondition(f"the {backend} backend decodes on a CUDA device, not "
                                     f"{self.device}; use backend='pillow' (or 'auto')")
        if backend == "nvjpeg" and _torchvision_io() is None:
            raise FailedPrecondition("the nvjpeg backend needs torchvision (with CUDA), which "
                                     "does not import here; install it beside a CUDA torch")
        self.backend = backend
        self._dali = _DaliJpeg(self.device) if backend == "dali" else None

    def decode(self, samples: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each encoded sample as a ``[3, H, W]`` uint8 RGB tensor on the device, in order.

        `samples` are 1-D uint8 CPU tensors (views of a read-ahead slot are
        fine).  JPEGs go to the backend together; other formats, and JPEGs
        the GPU decoder refuses (CMYK, say), are decoded by Pillow one by
        one.  Raises InvalidArgument for a sample no decoder reads.  Cost: one
        batched GPU decode call, plus one Pillow decode per other sample.
        """
        out: list[torch.Tensor | None] = [None] * len(samples)
        jpegs = [i for i, s in enumerate(samples) if is_jpeg(s)] \
            if self.backend != "pillow" else []
        if jpegs:
            decoded = self._decode_jpegs([samples[i] for i in jpegs])
            for i, image in zip(jpegs, decoded):
                out[i] = image
        for i, image in enumerate(out):
            if image is None:
                image = pillow_decode(samples[i])
                out[i] = image if self.device.type == "cpu" else \
                    image.pin_memory().to(self.device, non_blocking=True)
        return out  # type: ignore[return-value]

    def _decode_jpegs(self, jpegs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The JPEGs on the device; None where the batch decoder failed (Pillow takes those)."""
        try:
            if self._dali is not None:
                return self._dali.decode(jpegs)
            tvio = _torchvision_io()
            return tvio.decode_jpeg(jpegs, mode=tvio.ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            # One image the batch decoder cannot read fails the whole call: decode each alone.
            return [self._decode_one(jpeg) for jpeg in jpegs]

    def _decode_one(self, jpeg: torch.Tensor) -> torch.Tensor | None:
        try:
            if self._dali is not None:
                return self._dali.decode([jpeg])[0]
            tvio = _torchvision_io()
            return tvio.decode_jpeg(jpeg, mode=tvio.ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return None


def _torchvision_io():
    """``torchvision.io``, or None when torchvision does not import (not installed, or a build
    that does not match torch's)."""
    try:
        import torchvision.io
    except (ImportError, RuntimeError):
        return None
    return torchvision.io


class _DaliJpeg:
    """A DALI pipeline that decodes one batch of JPEGs with the mixed (GPU) decoder."""

    def __init__(self, device: torch.device):
        try:
            from nvidia import dali  # noqa: F401
        except ImportError:
            raise FailedPrecondition("the dali backend needs NVIDIA DALI (nvidia-dali-cudaXXX), "
                                     "which is not installed; use backend='nvjpeg'") from None
        self.device = device
        self._pipelines: dict[int, object] = {}

    def _pipeline(self, batch: int):
        capacity = 1 << max(0, (batch - 1).bit_length())  # one pipeline per power of two
        if capacity not in self._pipelines:
            from nvidia.dali import fn, pipeline_def, types

            @pipeline_def(batch_size=capacity, num_threads=4, device_id=self.device.index or 0,
                          prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
            def jpeg_pipeline():
                encoded = fn.external_source(name="encoded", device="cpu", no_copy=True)
                return fn.decoders.image(encoded, device="mixed", output_type=types.RGB)

            pipeline = jpeg_pipeline()
            pipeline.build()
            self._pipelines[capacity] = pipeline
        return self._pipelines[capacity]

    def decode(self, jpegs: list[torch.Tensor]) -> list[torch.Tensor]:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        pipeline = self._pipeline(len(jpegs))
        pipeline.feed_input("encoded", [j.numpy() for j in jpegs])
        (images,) = pipeline.run()
        stream = torch.cuda.current_stream(self.device)
        out = []
        for i in range(len(jpegs)):
            tensor = images[i]
            hwc = torch.empty(tuple(tensor.shape()), dtype=torch.uint8, device=self.device)
            feed_ndarray(tensor, hwc, cuda_stream=stream)
            out.append(hwc.permute(2, 0, 1))
        return out
