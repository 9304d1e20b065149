"""The GPU decode path in its CPU form: decode, batched crop/resize/flip/normalise, DecodedBatches.

Every result is checked against a reference computed another way: pixels
from the source arrays (PNG is lossless; JPEG within its loss), crops by
slicing each image and resizing it alone with ``F.interpolate``, the
normalisation written out.  The end-to-end tests read JPEGs and PNGs from a
real daemon through ReadAhead.
"""

from __future__ import annotations

import collections
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from dlfs import Client  # noqa: E402
from dlfs.errors import FailedPrecondition, InvalidArgument  # noqa: E402
from dlfs.torch import (DecodedBatches, DLFSDataset, ImageDecoder, ReadAhead,  # noqa: E402
                        ShuffleShardSampler)
from dlfs.torch.image_augment import (IMAGENET_MEAN, IMAGENET_STD, CropBoxes,  # noqa: E402
                                      center_crop_boxes, crop_resize, image_sizes,
                                      random_resized_crop_boxes)
from dlfs.torch.image_decode import is_jpeg, pillow_decode  # noqa: E402
from helpers.trees import unique_name, write_tree  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.set_vital. is deprecated")


def encode(pixels: np.ndarray, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **options)
    return out.getvalue()


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def smooth_image(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth RGB picture (gradients and a blob): JPEG keeps it within a few levels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = rng.uniform(40, 200, size=3)
    pixels = np.stack([base[c] + 40 * np.sin(x / (7 + 3 * c) + y / 11) for c in range(3)], -1)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def reference(image: torch.Tensor, top, left, height, width, flip, size) -> torch.Tensor:
    """One image's crop resized alone, mirrored, normalised: [3, size, size] float."""
    crop = image[None, :, top:top + height, left:left + width].float()
    out = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False)[0]
    if flip:
        out = out.flip(-1)
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    return (out / 255 - mean) / std


# --- decoding -----------------------------------------------------------------------

def test_pillow_decodes_png_exactly_and_jpeg_within_its_loss():
    pixels = smooth_image(23, 41, seed=1)
    png = pillow_decode(as_tensor(encode(pixels, "PNG")))
    assert png.shape == (3, 23, 41) and png.dtype == torch.uint8
    assert torch.equal(png, torch.from_numpy(pixels).permute(2, 0, 1))
    jpeg = pillow_decode(as_tensor(encode(pixels, "JPEG", quality=95)))
    error = (jpeg.int() - torch.from_numpy(pixels).permute(2, 0, 1).int()).abs().float()
    assert jpeg.shape == (3, 23, 41) and error.mean() < 3
    gray = np.arange(30, dtype=np.uint8).reshape(5, 6)
    assert torch.equal(pillow_decode(as_tensor(encode(gray, "PNG"))),
                       torch.from_numpy(gray)[None].expand(3, 5, 6))


def test_decoder_tells_jpeg_from_others_and_refuses_what_is_not_an_image():
    pixels = smooth_image(8, 8, seed=2)
    assert is_jpeg(as_tensor(encode(pixels, "JPEG")))
    assert not is_jpeg(as_tensor(encode(pixels, "PNG"))) and not is_jpeg(as_tensor(b"\xff"))
    decoder = ImageDecoder("cpu")
    assert decoder.backend == "pillow"
    images = decoder.decode([as_tensor(encode(pixels, "PNG")), as_tensor(encode(pixels, "JPEG"))])
    assert [tuple(i.shape) for i in images] == [(3, 8, 8), (3, 8, 8)]
    with pytest.raises(InvalidArgument, match="not an image"):
        decoder.decode([as_tensor(b"plain text, not a picture")])


def test_gpu_backends_are_refused_on_a_cpu_device():
    for backend in ("nvjpeg", "dali"):
        with pytest.raises(FailedPrecondition, match="CUDA device"):
            ImageDecoder("cpu", backend)
    with pytest.raises(InvalidArgument):
        ImageDecoder("cpu", "libjpeg-turbo")


# --- the batched crop -----------------------------------------------------------------

SIZES = [(37, 50), (64, 31), (20, 20), (120, 90), (5, 300), (224, 224)]


def images_of(sizes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator)
            for h, w in sizes]


@pytest.mark.parametrize("size", (1, 7, 32))
def test_crop_resize_matches_each_image_resized_alone(size):
    images = images_of(SIZES)
    for boxes in (random_resized_crop_boxes(image_sizes(images),
                                            generator=torch.Generator().manual_seed(size)),
                  center_crop_boxes(image_sizes(images))):
        batch = crop_resize(images, boxes, size)
        assert batch.shape == (len(images), 3, size, size) and batch.dtype == torch.float32
        assert batch.is_contiguous(memory_format=torch.channels_last)
        for i, image in enumerate(images):
            want = reference(image, int(boxes.top[i]), int(boxes.left[i]),
                             int(boxes.height[i]), int(boxes.width[i]), bool(boxes.flip[i]),
                             size)
            assert torch.allclose(batch[i], want, atol=1e-4), i


def test_crop_resize_flips_and_keeps_the_dtype_and_layout_asked_for():
    images = images_of([(16, 16), (16, 16)], seed=3)
    box = dict(top=torch.tensor([2, 2]), left=torch.tensor([1, 1]),
               height=torch.tensor([9, 9]), width=torch.tensor([12, 12]))
    plain = crop_resize(images, CropBoxes(**box, flip=torch.tensor([False, False])), 8)
    mirrored = crop_resize(images, CropBoxes(**box, flip=torch.tensor([True, False])), 8)
    assert torch.equal(mirrored[0], plain[0].flip(-1)) and torch.equal(mirrored[1], plain[1])
    half = crop_resize(images, CropBoxes(**box, flip=torch.tensor([False, False])), 8,
                       dtype=torch.bfloat16, channels_last=False)
    assert half.dtype == torch.bfloat16 and half.is_contiguous()
    assert torch.allclose(half.float(), plain, atol=0.05)
    with pytest.raises(InvalidArgument, match="outside"):
        crop_resize(images, CropBoxes(**{**box, "height": torch.tensor([9, 15])},
                                      flip=torch.tensor([False, False])), 8)
    with pytest.raises(InvalidArgument, match="uint8"):
        crop_resize([images[0].float()], CropBoxes(**{k: v[:1] for k, v in box.items()},
                                                   flip=torch.tensor([False])), 8)


def test_random_boxes_follow_random_resized_crop_rules():
    sizes = torch.tensor([(375, 500)] * 2000 + [(4, 400)] * 50 + [(1, 1)] * 5)
    boxes = random_resized_crop_boxes(sizes, generator=torch.Generator().manual_seed(0))
    again = random_resized_crop_boxes(sizes, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(vars(boxes).values(), vars(again).values()))
    h, w = sizes[:, 0], sizes[:, 1]
    assert bool(((boxes.top >= 0) & (boxes.left >= 0) & (boxes.height >= 1) & (boxes.width >= 1)
                 & (boxes.top + boxes.height <= h) & (boxes.left + boxes.width <= w)).all())
    # Ordinary images: area within scale, aspect within ratio (up to the rounding to pixels).
    area = (boxes.height * boxes.width).double()[:2000] / (375 * 500)
    aspect = (boxes.width.double() / boxes.height.double())[:2000]
    assert area.min() > 0.075 and area.max() <= 1.0
    assert aspect.min() > 0.7 and aspect.max() < 1.4
    assert 0.4 < boxes.flip[:2000].double().mean() < 0.6
    # A 4 x 400 strip fits no draw: the fallback is its centred part of ratio 4/3.
    strip = slice(2000, 2050)
    assert bool((boxes.height[strip] == 4).all()) and bool((boxes.width[strip] == 5).all())
    assert bool((boxes.left[strip] == (400 - 5) // 2).all())


# --- DecodedBatches against a daemon ---------------------------------------------------

CLASSES = ("apple", "bean", "corn")
COUNT = 18


def colour_of(index: int) -> tuple[int, int, int]:
    return (20 + 12 * index, 230 - 9 * index, 60 + (37 * index) % 150)


@pytest.fixture(scope="module")
def pictures(shared_daemon, tmp_path_factory):
    """COUNT images of several sizes and formats, each one flat colour: its identity."""
    files, pixels = {}, {}
    for i in range(COUNT):
        height, width = 20 + 3 * i, 45 - 2 * i
        array = np.empty((height, width, 3), dtype=np.uint8)
        array[:] = colour_of(i)
        fmt, ext = (("PNG", "png") if i % 4 == 0 else ("JPEG", "jpg"))
        path = f"{CLASSES[i % 3]}/{i:03d}.{ext}"
        files[path] = encode(array, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        pixels[path] = array
    root = tmp_path_factory.mktemp("pictures")
    write_tree(root, files)
    name = unique_name("pictures")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
    return shared_daemon.address, name, files, pixels


def identify(image: torch.Tensor) -> int:
    """Which picture a decoded, normalised image is: the index of its flat colour."""
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    rgb = ((image.float() * std + mean) * 255).mean((1, 2))
    distances = [float((rgb - torch.tensor(colour_of(i), dtype=torch.float32)).abs().max())
                 for i in range(COUNT)]
    best = int(np.argmin(distances))
    assert distances[best] < 3, distances[best]
    return best


def stack(ds, batch_size=4, seed=0):
    sampler = ShuffleShardSampler(len(ds), seed=seed)
    read_ahead = ReadAhead(sampler, ds, batch_size=batch_size, batches=2, stack=False)
    return read_ahead, stateful_dataloader.StatefulDataLoader(ds, batch_size=None,
                                                              sampler=read_ahead)


def test_decoded_batches_match_an_independent_decode_and_crop(pictures):
    address, name, files, _pixels = pictures
    ds = DLFSDataset(address, name)
    paths = sorted(files)
    read_ahead, loader = stack(ds)
    try:
        batches = DecodedBatches(loader, device="cpu", size=12, train=False)
        order = read_ahead.sampler.indices()
        seen = 0
        for images, labels in batches:
            assert images.shape[1:] == (3, 12, 12)
            for image, label in zip(images, labels):
                path = paths[order[seen]]
                assert int(label) == CLASSES.index(path.split("/")[0])
                source = torch.from_numpy(np.array(
                    Image.open(io.BytesIO(files[path])).convert("RGB"))).permute(2, 0, 1)
                side = round(min(source.shape[1:]) * 224 / 256)
                top, left = (source.shape[1] - side) // 2, (source.shape[2] - side) // 2
                want = reference(source, top, left, side, side, False, 12)
                assert torch.allclose(image, want, atol=1e-4), path
                seen += 1
        assert seen == COUNT and batches.stats.batches == 5 and batches.stats.images == COUNT
    finally:
        read_ahead.close()


def test_training_crops_are_random_resized_crops_of_each_image(pictures):
    address, name, files, _pixels = pictures
    ds = DLFSDataset(address, name)
    paths = sorted(files)
    read_ahead, loader = stack(ds, batch_size=6)
    try:
        batches = DecodedBatches(loader, device="cpu", size=10, train=True, seed=5)
        generator = torch.Generator().manual_seed(5)  # what the first iteration draws from
        order = read_ahead.sampler.indices()
        seen = 0
        for images, _labels in batches:
            sources = [torch.from_numpy(np.array(Image.open(io.BytesIO(
                files[paths[order[seen + k]]])).convert("RGB"))).permute(2, 0, 1)
                for k in range(len(images))]
            boxes = random_resized_crop_boxes(image_sizes(sources), generator=generator)
            for k, (image, source) in enumerate(zip(images, sources)):
                want = reference(source, int(boxes.top[k]), int(boxes.left[k]),
                                 int(boxes.height[k]), int(boxes.width[k]), bool(boxes.flip[k]),
                                 10)
                assert torch.allclose(image, want, atol=1e-4)
            seen += len(images)
        assert seen == COUNT
    finally:
        read_ahead.close()


@pytest.mark.parametrize("stop", (1, 3))
def test_decoded_batches_resume_after_the_batches_handed_out(pictures, stop):
    """The decode thread runs ahead; the state counts only what the loop received."""
    address, name, _files, _pixels = pictures
    ds = DLFSDataset(address, name)
    made = []

    def batches():
        read_ahead, loader = stack(ds, seed=3)
        made.append(read_ahead)
        return DecodedBatches(loader, device="cpu", size=8, train=False, ahead=3)

    try:
        first = batches()
        before = []
        for number, (images, _labels) in enumerate(first):
            before += [identify(image) for image in images]
            if number + 1 == stop:
                state = first.state_dict()
                break
        second = batches()
        second.load_state_dict(state)
        after = [identify(image) for images, _labels in second for image in images]
        assert collections.Counter(before + after) == collections.Counter(range(COUNT))
        assert len(before) == 4 * stop
    finally:
        for read_ahead in made:
            read_ahead.close()


def test_a_plain_dataloader_over_read_ahead_resumes_through_the_sampler(pictures):
    address, name, _files, _pixels = pictures
    ds = DLFSDataset(address, name)
    read_ahead = ReadAhead(ShuffleShardSampler(len(ds), seed=8), ds, batch_size=5, stack=False)
    try:
        batches = DecodedBatches(DataLoader(ds, batch_size=None, sampler=read_ahead),
                                 device="cpu", size=8, train=False)
        it = iter(batches)
        before = [identify(image) for image in next(it)[0]]
        state = batches.state_dict()
        it.close()
        assert state == {"sampler": read_ahead.sampler.state_dict(consumed=5)}
        batches.load_state_dict(state)
        after = [identify(image) for images, _labels in batches for image in images]
        assert sorted(before + after) == list(range(COUNT))
    finally:
        read_ahead.close()


def test_the_ring_a_batch_lies_in_is_found_for_pinning(pictures):
    from dlfs.ring import BatchRing

    address, name, _files, _pixels = pictures
    ds = DLFSDataset(address, name)
    read_ahead, loader = stack(ds)
    try:
        samples, _labels = next(iter(loader))
        start, end, memory = BatchRing.region_of(samples[0].data_ptr())
        assert start == read_ahead.ring.region_of(samples[-1].data_ptr())[0]
        assert end - start == memory.size >= sum(s.numel() for s in samples)
        assert BatchRing.region_of(torch.zeros(4).data_ptr()) is None
    finally:
        read_ahead.close()


def test_stacked_batches_are_refused_with_the_fix(pictures):
    address, name, _files, _pixels = pictures
    ds = DLFSDataset(address, name)
    loader = DataLoader(range(8), batch_size=4)  # batches of int tensors, not encoded images
    with pytest.raises(InvalidArgument, match="stack=False"):
        next(iter(DecodedBatches(loader, device="cpu", size=8)))
    with pytest.raises(InvalidArgument, match="keeps no position"):
        DecodedBatches(loader, device="cpu").state_dict()
    with pytest.raises(InvalidArgument):
        DecodedBatches(loader, device="cpu", ahead=0)


def test_fetch_and_decode_show_as_profiler_ranges(pictures):
    address, name, _files, _pixels = pictures
    ds = DLFSDataset(address, name)
    read_ahead, loader = stack(ds)
    try:
        batches = DecodedBatches(loader, device="cpu", size=8, train=False)
        # The ranges are recorded on the decode thread: ask the profiler for every thread.
        every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    experimental_config=every_thread) as prof:
            for _ in batches:
                pass
        names = {event.name for event in prof.events()}
        assert {"dlfs.fetch", "dlfs.decode", "dlfs.augment"} <= names
    finally:
        read_ahead.close()
