"""Crop, resize, flip and normalise a batch of images of different sizes in one pass.

    boxes = random_resized_crop_boxes(sizes, generator=g)     # or center_crop_boxes(sizes)
    batch = crop_resize(images, boxes, size=224)               # [B, 3, 224, 224] float

`images` are ``[3, H, W]`` uint8 tensors on one device, each of its own size
(what `dlfs.torch.image_decode.ImageDecoder` returns).  The boxes are drawn
on the CPU from the sizes alone (torchvision's RandomResizedCrop rule, for
all images at once); `crop_resize` then makes the whole batch with a fixed
number of tensor operations whatever the batch size: the images are laid
end to end in one flat buffer (one ``torch.cat``), and every output pixel of
every image is a bilinear blend of four gathered source pixels, the flip
folded into the gather and the normalisation into the blend.  No Python loop
runs per image, and no padded batch of the largest image is built, so the
cost follows the output size, not the input sizes.

The resize is bilinear without antialiasing, exactly what
``torch.nn.functional.interpolate(crop, size, mode="bilinear",
align_corners=False)`` gives for each crop (tested against it): a large crop
shrunk several times over aliases, as it does with torchvision's tensor
transforms at ``antialias=False``.  Runs on any device; on the CPU for the
tests and for machines without a GPU.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from dlfs.errors import InvalidArgument

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's RandomResizedCrop defaults, and how many draws it makes before its fallback.
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
CROP_TRIES = 10
# Resize(256) then CenterCrop(224): the evaluation transform of the ImageNet references.
CENTER_FRACTION = 224 / 256


@dataclasses.dataclass(frozen=True)
class CropBoxes:
    """Per image of a batch: the crop's top row, left column, height, width (int64 CPU
    tensors, pixels of the source image) and whether the result is mirrored (bool)."""

    top: torch.Tensor
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor
    flip: torch.Tensor

    def __len__(self) -> int:
        return len(self.top)


def image_sizes(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[B, 2]`` int64 (height, width) of ``[3, H, W]`` images (their shapes, no device sync)."""
    return torch.tensor([tuple(image.shape[-2:]) for image in images], dtype=torch.int64
                        ).reshape(-1, 2)


def random_resized_crop_boxes(sizes: torch.Tensor, *, scale=CROP_SCALE, ratio=CROP_RATIO,
                              flip: bool = True, generator: torch.Generator | None = None
                              ) -> CropBoxes:
    """torchvision's RandomResizedCrop box for each image, drawn for the batch at once.

    Per image, up to `CROP_TRIES` draws of an area fraction in `scale` and a
    log-uniform aspect ratio in `ratio`; the first that fits the image is
    placed uniformly at random; when none fits, the largest centred crop
    whose ratio is within `ratio`.  With `flip`, each image is mirrored
    with probability 1/2.  Deterministic for a seeded `generator`.  Cost:
    O(B) tensor work on the CPU.
    """
    sizes = torch.as_tensor(sizes, dtype=torch.int64).reshape(-1, 2)
    count = len(sizes)
    height, width = sizes[:, 0].double(), sizes[:, 1].double()
    area = (height * width)[:, None]
    fraction = torch.empty(count, CROP_TRIES, dtype=torch.float64).uniform_(
        scale[0], scale[1], generator=generator)
    log_ratio = torch.empty(count, CROP_TRIES, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    aspect = torch.exp(log_ratio)
    w = torch.round(torch.sqrt(area * fraction * aspect))
    h = torch.round(torch.sqrt(area * fraction / aspect))
    fits = (w > 0) & (h > 0) & (w <= width[:, None]) & (h <= height[:, None])
    first = torch.where(fits.any(1), fits.double().argmax(1), -1)
    rows = torch.arange(count)
    chosen = first.clamp(min=0)
    crop_h = torch.where(first >= 0, h[rows, chosen], 0).long()
    crop_w = torch.where(first >= 0, w[rows, chosen], 0).long()
    # The fallback: the whole image, cut to the nearest ratio allowed.
    in_ratio = width / height
    fallback_w = torch.where(in_ratio < ratio[0], width,
                             torch.where(in_ratio > ratio[1], torch.round(height * ratio[1]),
                                         width))
    fallback_h = torch.where(in_ratio < ratio[0], torch.round(width / ratio[0]),
                             torch.where(in_ratio > ratio[1], height, height))
    fallback = first < 0
    crop_h = torch.where(fallback, fallback_h.long(), crop_h)
    crop_w = torch.where(fallback, fallback_w.long(), crop_w)
    spare_h, spare_w = sizes[:, 0] - crop_h, sizes[:, 1] - crop_w
    pick = torch.rand(count, 2, dtype=torch.float64, generator=generator)
    top = torch.where(fallback, spare_h // 2, (pick[:, 0] * (spare_h + 1)).long())
    left = torch.where(fallback, spare_w // 2, (pick[:, 1] * (spare_w + 1)).long())
    mirror = torch.rand(count, generator=generator) < 0.5 if flip \
        else torch.zeros(count, dtype=torch.bool)
    return CropBoxes(top, left, crop_h, crop_w, mirror)


def center_crop_boxes(sizes: torch.Tensor, fraction: float = CENTER_FRACTION) -> CropBoxes:
    """The centred square of side ``fraction x`` the shorter side of each image, unmirrored
    (resized to 224 it is ``Resize(256)`` then ``CenterCrop(224)``, up to rounding)."""
    sizes = torch.as_tensor(sizes, dtype=torch.int64).reshape(-1, 2)
    side = torch.clamp((sizes.min(1).values.double() * fraction).round().long(), min=1)
    top = (sizes[:, 0] - side) // 2
    left = (sizes[:, 1] - side) // 2
    return CropBoxes(top, left, side, side.clone(), torch.zeros(len(sizes), dtype=torch.bool))


def crop_resize(images: Sequence[torch.Tensor], boxes: CropBoxes, size: int, *,
                mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                dtype: torch.dtype = torch.float32, channels_last: bool = True) -> torch.Tensor:
    """Each image's box, resized to ``size x size``, mirrored where the box says, normalised.

    Returns ``[B, 3, size, size]`` of `dtype` on the images' device, values
    ``(pixel / 255 - mean) / std`` per channel, in channels-last memory
    order (what convolutions on a GPU prefer) unless `channels_last` is
    false.  Raises InvalidArgument for images that are not ``[3, H, W]``
    uint8 on one device, or boxes outside them.  Cost: one copy of the
    decoded pixels (the flat buffer), then about a dozen whole-batch tensor
    operations on ``B x size x size`` elements; no per-image step.
    """
    count = len(images)
    if count != len(boxes) or count == 0:
        raise InvalidArgument(f"{count} images and {len(boxes)} boxes: one box per image, "
                              "and at least one image")
    device = images[0].device
    if any(i.dtype != torch.uint8 or i.dim() != 3 or i.shape[0] != 3 or i.device != device
           for i in images):
        raise InvalidArgument("crop_resize takes [3, H, W] uint8 images on one device "
                              "(ImageDecoder.decode gives those)")
    sizes = image_sizes(images)
    top, left, height, width = boxes.top, boxes.left, boxes.height, boxes.width
    if bool(((height < 1) | (width < 1) | (top < 0) | (left < 0)
             | (top + height > sizes[:, 0]) | (left + width > sizes[:, 1])).any()):
        raise InvalidArgument("a crop box lies outside its image")
    flat = torch.cat([image.reshape(-1) for image in images])
    plane = sizes[:, 0] * sizes[:, 1]  # pixels per channel of each image
    starts = torch.cumsum(plane * 3, 0) - plane * 3
    # Source coordinates (inside each crop) of every output row and column, as
    # interpolate(align_corners=False) computes them; all [B, size].
    rows, row_weight = _taps(height, size)
    cols, col_weight = _taps(width, size)
    cols = torch.where(boxes.flip[:, None, None], cols.flip(1), cols)
    col_weight = torch.where(boxes.flip[:, None, None], col_weight.flip(1), col_weight)
    # Everything so far is O(B x size) on the CPU; from here on the B x size x size
    # tensors are made on the images' device.
    row_base = ((top[:, None, None] + rows) * sizes[:, 1, None, None]).to(device)  # [B, size, 2]
    col_base = (left[:, None, None] + cols).to(device)                             # [B, size, 2]
    pixel = (starts.to(device)[:, None, None, None, None] + row_base[:, :, None, :, None]
             + col_base[:, None, :, None, :])          # [B, size, size, 2, 2]: y0/y1 x x0/x1
    weight = (row_weight.to(device, torch.float32)[:, :, None, :, None]
              * col_weight.to(device, torch.float32)[:, None, :, None, :])
    plane_on_device = plane.to(device)[:, None, None, None, None]
    scale = torch.tensor([1 / (255 * s) for s in std], dtype=torch.float32, device=device)
    shift = torch.tensor([m / s for m, s in zip(mean, std)], dtype=torch.float32, device=device)
    channels = []
    for channel in range(3):  # three gathers for the whole batch, one per colour plane
        values = flat[pixel + channel * plane_on_device].to(torch.float32)
        channels.append((values * weight).sum((-2, -1)))
    out = torch.stack(channels, dim=-1) * scale - shift  # [B, size, size, 3]: channels last
    out = out.to(dtype).permute(0, 3, 1, 2)
    return out if channels_last else out.contiguous()


def _taps(extent: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two source indices (inside a crop of `extent` pixels) and their weights for each of
    `size` output positions: ``[B, size, 2]`` int64 and float64, as bilinear interpolate
    with ``align_corners=False`` picks them (the source clamped to the crop)."""
    extent = extent.double()[:, None]
    source = ((torch.arange(size, dtype=torch.float64) + 0.5) * extent / size - 0.5).clamp(min=0)
    # interpolate computes in the tensor's float type; match its rounding of the scale.
    source = source.to(torch.float32).double()
    low = source.floor()
    high = torch.minimum(low + 1, extent - 1)
    frac = source - low
    index = torch.stack([low, high], dim=-1).long()
    weight = torch.stack([1 - frac, frac], dim=-1)
    return index, weight
