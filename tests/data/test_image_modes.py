"""Every PIL mode a decoder gives reaches the model at its full range (``data/image_modes.py``): each file is written
with PIL or numpy, read through a source (imagefolder; hf and webdataset for the 16-bit PNG), and its pixels compared
with the expected ones. Images whose pixels have no defined scale are skipped and counted like unreadable ones."""

import io
import struct
import zlib

import datasets
import numpy as np
import pytest
from PIL import Image

from dit_trainer.data.sources.hf import HFImageDataset
from dit_trainer.data.sources.imagefolder import ImageFolderDataset
from dit_trainer.data.sources.transforms import decode_image, to_model_input
from dit_trainer.data.sources.webdataset import WebDatasetSource

from .files import HF_FEATURES, image_folder, write_shards

SIDE = 16  # images are SIDE x SIDE and read at resolution SIDE: no resampling, so every pixel can be compared
RAMP = np.linspace(0, 65535, SIDE * SIDE).round().astype(np.uint16).reshape(SIDE, SIDE)  # a full-range gradient
RAMP_8 = (RAMP >> 8).astype(np.uint8)  # its high byte: what PIL makes of 16-bit RGB PNGs


def saved(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def png_16_bit(channels: np.ndarray, color_type: int) -> bytes:
    """A 16-bit PNG written by hand (PIL cannot write 48/64-bit ones): color type 2 is RGB, 4 grey + alpha."""
    height, width = channels.shape[:2]
    raw = b"".join(b"\0" + channels[row].astype(">u2").tobytes() for row in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def grey(values: np.ndarray) -> np.ndarray:
    return np.repeat(values[..., None], 3, axis=2).astype(np.uint8)


def on_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha[..., None].astype(float) / 255
    return np.rint(rgb * a + 255 * (1 - a)).astype(np.uint8)


def sixteen_bit(mode: str, values: np.ndarray = RAMP) -> Image.Image:
    return Image.frombytes(mode, (SIDE, SIDE), values.astype(">u2" if mode == "I;16B" else "<u2").tobytes())


PALETTE = np.array([[255, 0, 0], [0, 0, 255], [0, 200, 0]], np.uint8)
INDICES = np.arange(SIDE * SIDE).reshape(SIDE, SIDE) % 3
ALPHA = np.tile(np.array([0, 128, 255], np.uint8), SIDE * SIDE // 3 + 1)[: SIDE * SIDE].reshape(SIDE, SIDE)
COLOURS = np.random.default_rng(0).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
CMYK = np.array([[255, 0, 0, 0], [0, 255, 0, 0], [0, 0, 255, 0], [0, 0, 0, 255], [0, 0, 0, 0]], np.uint8)
CMYK_AS_RGB = np.array([[0, 255, 255], [255, 0, 255], [255, 255, 0], [0, 0, 0], [255, 255, 255]], np.uint8)
CMYK_PIXELS = CMYK[np.arange(SIDE * SIDE).reshape(SIDE, SIDE) % 5]


def palette_png() -> bytes:
    image = Image.fromarray(INDICES.astype(np.uint8), "P")
    image.putpalette(PALETTE.flatten().tolist())
    return saved(image, "PNG", transparency=1)  # index 1 (blue) is transparent


def exif_rotated_png(image: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned: a viewer rotates it 90 degrees clockwise
    return saved(image, "PNG", exif=exif)


# name -> (file bytes, the RGB pixels the model must get)
CASES = {
    "I;16 png (16-bit grey)": (saved(sixteen_bit("I;16"), "PNG"), grey(RAMP_8)),
    "I;16 tiff": (saved(sixteen_bit("I;16"), "TIFF"), grey(RAMP_8)),
    "I;16B tiff": (saved(sixteen_bit("I;16B"), "TIFF"), grey(RAMP_8)),
    "I pgm (16-bit)": (f"P5 {SIDE} {SIDE} 65535\n".encode() + RAMP.astype(">u2").tobytes(), grey(RAMP_8)),
    "I tiff (32-bit integers in 0..65535)": (saved(Image.fromarray(RAMP.astype(np.int32), "I"), "TIFF"), grey(RAMP_8)),
    "F tiff (float in [0, 1])": (
        saved(Image.fromarray((RAMP / 65535).astype(np.float32), "F"), "TIFF"),
        grey(np.rint(RAMP / 65535 * 255)),
    ),
    "RGB png, 48-bit": (
        png_16_bit(np.stack([RAMP, RAMP.T, 65535 - RAMP], -1), 2),
        np.stack([RAMP_8, RAMP_8.T, 255 - RAMP_8], -1),
    ),
    "LA png, 16-bit": (
        png_16_bit(np.stack([RAMP, ALPHA.astype(np.uint16) * 257], -1), 4),
        on_white(grey(RAMP_8), ALPHA),
    ),
    "I;16 png with a transparent value": (
        saved(sixteen_bit("I;16"), "PNG", transparency=int(RAMP[0, 5])),
        np.where((RAMP[0, 5] == RAMP)[..., None], 255, grey(RAMP_8)).astype(np.uint8),
    ),
    "L png": (saved(Image.fromarray(RAMP_8, "L"), "PNG"), grey(RAMP_8)),
    "L png with a transparent value": (
        saved(Image.fromarray(RAMP_8 // 16 * 16, "L"), "PNG", transparency=32),
        np.where((RAMP_8 // 16 * 16 == 32)[..., None], 255, grey(RAMP_8 // 16 * 16)).astype(np.uint8),
    ),
    "1 png": (saved(Image.fromarray(RAMP_8 > 127), "PNG"), grey(np.where(RAMP_8 > 127, 255, 0))),
    "LA png": (saved(Image.fromarray(np.stack([RAMP_8, ALPHA], -1), "LA"), "PNG"), on_white(grey(RAMP_8), ALPHA)),
    "P png with a transparent index": (
        palette_png(),
        np.where((INDICES == 1)[..., None], 255, PALETTE[INDICES]).astype(np.uint8),
    ),
    "RGB png": (saved(Image.fromarray(COLOURS), "PNG"), COLOURS),
    "RGB png with a transparent colour": (
        saved(Image.fromarray(PALETTE[INDICES]), "PNG", transparency=(0, 0, 255)),
        np.where((INDICES == 1)[..., None], 255, PALETTE[INDICES]).astype(np.uint8),
    ),
    "RGBA png": (
        saved(Image.fromarray(np.dstack([COLOURS, ALPHA]), "RGBA"), "PNG"),
        on_white(COLOURS, ALPHA),
    ),
    "CMYK tiff": (
        saved(Image.fromarray(CMYK_PIXELS, "CMYK"), "TIFF"),
        CMYK_AS_RGB[np.arange(SIDE * SIDE).reshape(SIDE, SIDE) % 5],
    ),
    "EXIF orientation 6": (exif_rotated_png(Image.fromarray(COLOURS)), np.rot90(COLOURS, k=-1)),
    "I;16 png with EXIF orientation 6": (exif_rotated_png(sixteen_bit("I;16")), grey(np.rot90(RAMP_8, k=-1))),
}


@pytest.fixture(scope="module")
def read_cases(tmp_path_factory):
    """Every case through one image folder: name -> (the pixels read as (H, W, 3), the expected ones)."""
    root = tmp_path_factory.mktemp("modes")
    files = {
        f"{i}.{'tif' if 'tiff' in n else 'pgm' if 'pgm' in n else 'png'}": data
        for i, (n, (data, _)) in enumerate(CASES.items())
    }
    image_folder(root, [{"file_name": name, "text": case} for name, case in zip(files, CASES)], files)
    dataset = ImageFolderDataset(root, resolution=SIDE)
    read = {}
    for index in range(len(dataset)):
        item = dataset[index]
        assert "bad_files" not in item, item["bad_files"]
        read[item["caption"]] = (item["image"].permute(1, 2, 0).numpy(), CASES[item["caption"]][1])
    return read


@pytest.mark.parametrize("case", list(CASES))
def test_each_mode_reaches_the_model_at_its_full_range(read_cases, case):
    pixels, expected = read_cases[case]
    assert pixels.dtype == np.uint8 and pixels.shape == expected.shape
    difference = np.abs(pixels.astype(int) - expected.astype(int))
    assert difference.max() <= (1 if "LA" in case or "RGBA" in case else 0), f"{case}: off by {difference.max()}"


def test_a_16_bit_png_is_not_clipped_to_white():
    """The user trial's file: a full-range 16-bit grey gradient came out min 248 / mean 255."""
    image = decode_image(CASES["I;16 png (16-bit grey)"][0])
    assert image.mode == "I;16"
    pixels = to_model_input(image, SIDE)
    assert pixels.min() == 0 and pixels.max() == 255 and abs(pixels.float().mean() - 127.5) < 1


def test_images_with_no_defined_scale_are_skipped_and_counted(tmp_path):
    """Signed or 32-bit integer samples and floats outside [0, 1] cannot be mapped to brightness: skipped like an
    unreadable file, with the reason in the record."""
    files = {
        "signed.tif": saved(Image.fromarray((RAMP.astype(np.int32) - 32768), "I"), "TIFF"),
        "hdr.tif": saved(Image.fromarray((RAMP / 6553.5).astype(np.float32), "F"), "TIFF"),
        "good.png": saved(Image.fromarray(COLOURS), "PNG"),
    }
    image_folder(tmp_path, [{"file_name": name, "text": name} for name in files], files)
    dataset = ImageFolderDataset(tmp_path, resolution=SIDE)
    assert dataset[0]["caption"] == "good.png"
    assert [record for index in range(3) for record in dataset[index].get("bad_files", [])] == [
        "signed.tif: ValueError: I pixels in [-32768, 32767], not 0..65535 (signed or 32-bit samples): no brightness "
        "scale to map",
        "hdr.tif: ValueError: float pixels in [0, 10], not [0, 1]: no brightness scale to map",
    ]


def test_a_16_bit_png_through_hf_and_webdataset(tmp_path):
    """The other file sources decode through the same path."""
    data, expected = CASES["I;16 png (16-bit grey)"]
    rows = {"image": [{"bytes": data, "path": None}], "text": ["ramp"]}
    datasets.Dataset.from_dict(rows, features=HF_FEATURES).save_to_disk(tmp_path / "saved")
    hf = HFImageDataset(str(tmp_path / "saved"), resolution=SIDE)[0]["image"]
    shards = write_shards(tmp_path, [[{"__key__": "ramp", "png": data, "txt": "ramp"}]])
    streamed = next(iter(WebDatasetSource(shards, SIDE)))["image"]
    for pixels in (hf, streamed):
        assert np.array_equal(pixels.permute(1, 2, 0).numpy(), expected)
