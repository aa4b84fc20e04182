"""Image preparation shared by the file-based sources (``data/sources/transforms.py``): crops, flips, bucket sizes,
sizes read from headers, bounded memory for elongated images, bit-identical outputs, and failures inside the transform
skipped and counted."""

import hashlib
import io

import pytest
import torch
from PIL import Image

from dit_trainer.data.sources.imagefolder import ImageFolderDataset
from dit_trainer.data.sources.transforms import header_size, resize_to_cover, to_model_input, to_tensor
from dit_trainer.data.sources.webdataset import WebDatasetSource
from dit_trainer.pixels import to_model_range
from tests.data.files import image_folder, noise_image, png_bytes, write_shards


def test_center_crop_keeps_the_middle_and_none_squashes_the_whole_image():
    bands = Image.new("RGB", (90, 20))  # red | green | blue, 30 pixels each: the centre square is all green
    for index, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        bands.paste(color, (30 * index, 0, 30 * index + 30, 20))
    center = to_model_range(to_model_input(bands, 12, crop="center"))
    assert torch.allclose(center, torch.tensor([-1.0, 1.0, -1.0]).view(3, 1, 1).expand(3, 12, 12), atol=0.05)
    squashed = to_model_input(bands, 12, crop="none")
    assert squashed[0, :, 0].min() > 242 and squashed[2, :, -1].min() > 242  # red left edge, blue right edge
    with pytest.raises(ValueError, match="crop"):
        to_model_input(bands, 12, crop="middle")


def test_random_crop_and_flip_are_windows_of_the_image_and_repeat_for_a_generator():
    image = noise_image()
    resized = to_tensor(resize_to_cover(image, 16, 16))  # (3, 16, 24): the random crop is a window of this
    windows = [resized[:, :, left : left + 16] for left in range(resized.shape[-1] - 16 + 1)]

    def crop(seed: int, **kwargs) -> torch.Tensor:
        return to_model_input(image, 16, generator=torch.Generator().manual_seed(seed), **kwargs)

    crops = [crop(seed, crop="random") for seed in range(12)]
    assert all(any(torch.equal(c, window) for window in windows) for c in crops)
    assert len({tuple(c.flatten()[:50].tolist()) for c in crops}) > 2  # several offsets are drawn
    assert all(torch.equal(crop(seed, crop="random"), crops[seed]) for seed in range(12))

    center = to_model_input(image, 16)
    flips = [crop(seed, horizontal_flip=True) for seed in range(12)]
    assert all(torch.equal(f, center) or torch.equal(f, center.flip(-1)) for f in flips)
    assert any(torch.equal(f, center) for f in flips) and any(torch.equal(f, center.flip(-1)) for f in flips)
    assert all(torch.equal(crop(seed, horizontal_flip=True), flips[seed]) for seed in range(12))


def test_images_are_resized_to_cover_the_bucket_and_cropped():
    image = Image.new("RGB", (160, 90), (255, 0, 0))
    assert to_model_input(image, (24, 40)).shape == (3, 24, 40)
    assert torch.equal(to_model_input(image, 32), to_model_input(image, (32, 32)))


def test_image_sizes_are_read_from_headers_with_exif_rotation():
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: decoded upright, the image is 20 wide and 30 high
    Image.new("RGB", (30, 20)).save(buffer, "JPEG", exif=exif)
    assert header_size(buffer.getvalue()) == (20, 30)
    assert header_size(b"not an image") is None


def _bands(size, middle=(0, 255, 0), ends=(255, 0, 0)) -> Image.Image:
    """``ends`` colour, with a square of ``middle`` colour at the centre of the long side."""
    image = Image.new("RGB", size, ends)
    short = min(size)
    offset = (max(size) - short) // 2
    box = (offset, 0, offset + short, short) if size[0] >= size[1] else (0, offset, short, offset + short)
    image.paste(middle, box)
    return image


def test_transforms_of_usual_images_are_bit_identical_to_before():
    """Aspect ratios up to 12:1 through every crop, against the outputs of the code before issue 17 (which
    normalised on the host): the loader's uint8 pixels normalised on the device are the same floats, bit for bit."""
    digest = hashlib.sha256()
    sizes = [(48, 32), (32, 48), (90, 20), (20, 90), (33, 33), (300, 37), (17, 200), (8, 8)]
    for seed, size in enumerate(sizes):
        for resolution in (16, 24):
            for crop, flip in (("center", False), ("random", True), ("none", False)):
                image = noise_image(size, seed)
                pixels = to_model_input(image, resolution, crop, flip, torch.Generator().manual_seed(seed))
                assert pixels.dtype == torch.uint8
                digest.update(to_model_range(pixels).numpy().tobytes())
    assert digest.hexdigest() == "38f6822d76b0b2229d6710240ef04a1472d7ed43e0669293378b65fd09c9bb47"


@pytest.mark.parametrize("size", [(10, 20000), (20000, 10)])
@pytest.mark.parametrize("crop", ["center", "random"])
def test_an_elongated_image_is_cropped_before_it_is_resized(monkeypatch, size, crop):
    """Resizing a 10 x 20000 image's short side to 256 would make a 256 x 512000 image (GBs at 1024 px): the
    square is cut out of the original first, so memory stays bounded by the target size."""
    resize = Image.Image.resize
    requested = []

    def bounded_resize(self, size, *args, **kwargs):
        requested.append(size)
        assert size[0] * size[1] <= 16 * 256 * 256, f"a resize to {size}"
        return resize(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", bounded_resize)
    pixels = to_model_input(_bands(size), 256, crop, generator=torch.Generator().manual_seed(0))
    assert pixels.shape == (3, 256, 256) and requested
    if crop == "center":
        assert torch.equal(pixels, torch.tensor([0, 255, 0], dtype=torch.uint8).view(3, 1, 1).expand(3, 256, 256))


def _failing_conversion(monkeypatch, size=(7, 7)) -> None:
    """Plant a failure in the transform (after decoding) for images of ``size``."""
    from dit_trainer.data.sources import transforms

    to_rgb = transforms.to_rgb

    def failing(image):
        if image.size == size:
            raise OSError("broken colour profile")
        return to_rgb(image)

    monkeypatch.setattr(transforms, "to_rgb", failing)


def test_an_image_that_fails_in_the_transform_is_skipped_and_counted(tmp_path, monkeypatch):
    _failing_conversion(monkeypatch)
    files = {"odd.png": png_bytes(size=(7, 7)), "good.png": png_bytes()}
    image_folder(tmp_path, [{"file_name": n, "text": n} for n in files], files)
    item = ImageFolderDataset(tmp_path, resolution=8)[0]
    assert item["caption"] == "good.png" and item["bad_files"] == ["odd.png: OSError: broken colour profile"]
    samples = [{"__key__": "odd", "png": png_bytes(size=(7, 7)), "txt": "odd"},
               {"__key__": "good", "png": png_bytes(), "txt": "good"}]  # fmt: skip
    items = list(WebDatasetSource(write_shards(tmp_path, [samples]), 8))
    assert [i["caption"] for i in items] == ["good"]
    assert items[0]["bad_files"][0].endswith("odd: OSError: broken colour profile")
