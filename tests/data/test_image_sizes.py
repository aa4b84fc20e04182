"""Image sizes for aspect-ratio buckets (``data/image_sizes.py``): declared by metadata.jsonl or hf columns (no image
opened at start-up, even for 20,000 images), otherwise read once into a sizes index that the next launch reuses and
that a changed file invalidates, kept in the reader's own folder (a run's, a cache's; none: nothing written); a declared
size only groups, the image still comes at its bucket's size."""

import json
import os

import datasets
import pytest
import torch
from accelerate import Accelerator
from PIL import Image

from dit_trainer.components.geometry import configured_buckets
from dit_trainer.data.buckets import Bucketed, BucketTable, item_buckets
from dit_trainer.data.image_sizes import image_sizes
from dit_trainer.data.loading import build_source
from dit_trainer.data.mixture import MixtureDataset
from dit_trainer.data.sources.hf import HFImageDataset
from dit_trainer.data.sources.imagefolder import ImageFolderDataset

from ..conftest import TINY_SHAPES, compose_config
from .files import SIZES, png_bytes
from .sizes_on_rank import sizes_on_rank

CANVASES = [(64, 64), (96, 48), (48, 96)]  # (width, height): square, landscape, portrait


def count_opens(monkeypatch, folder) -> list[str]:
    """A record of every image of ``folder`` opened from now on, by PIL or by the OS (a counter: the calls go through
    unchanged)."""
    opened, root = [], str(folder.resolve())
    pil_open, os_open = Image.open, os.open

    def counting_pil_open(file, *args, **kwargs):
        opened.append(str(getattr(file, "name", file)))
        return pil_open(file, *args, **kwargs)

    def counting_os_open(path, *args, **kwargs):
        if str(path).startswith(root):
            opened.append(str(path))
        return os_open(path, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_pil_open)
    monkeypatch.setattr(os, "open", counting_os_open)
    return opened


def write_folder(folder, count: int, declare: bool) -> None:
    """``count`` PNGs cycling through ``CANVASES``, with their sizes in metadata.jsonl when ``declare``."""
    folder.mkdir()
    blobs = [png_bytes(size=size) for size in CANVASES]
    rows = []
    for i in range(count):
        (folder / f"{i}.png").write_bytes(blobs[i % 3])
        width, height = CANVASES[i % 3]
        sizes = {"width": width, "height": height} if declare else {}
        rows.append({"file_name": f"{i}.png", "text": f"image {i}"} | sizes)
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_start_up_with_pixart_buckets_on_20000_images_with_declared_sizes_opens_no_image(tmp_path, monkeypatch):
    folder = tmp_path / "images"
    write_folder(folder, 20_000, declare=True)
    cfg = compose_config([*TINY_SHAPES, "data=imagefolder", f"data.path={folder}", "data.buckets=pixart",
                          "data.resolution=32", "data.num_workers=0"])  # fmt: skip
    opened = count_opens(monkeypatch, folder)
    sizes_dir = tmp_path / "run" / "image_sizes"
    buckets = configured_buckets(cfg.model, cfg.vae, cfg.data)
    dataset, _ = build_source(cfg.data, cfg.validation, cfg.trainer.batch_size, 0, buckets, None, Accelerator(cpu=True),
                              sizes_dir)  # fmt: skip
    assert opened == [] and not sizes_dir.exists()  # no header read, no index needed
    buckets = item_buckets(dataset)
    assert len(buckets) == 20_000 and len(set(buckets[:3])) == 3  # square, landscape and portrait buckets
    assert dataset[1]["image"].shape[-1] > dataset[1]["image"].shape[-2]  # training reads the images...
    assert opened  # ...and the counter sees it


def test_without_declared_sizes_the_index_is_written_once_reused_and_renewed_when_a_file_changes(tmp_path, monkeypatch):
    folder, sizes_dir = tmp_path / "images", tmp_path / "run" / "image_sizes"
    write_folder(folder, 30, declare=False)
    table = BucketTable(tuple(SIZES))  # (height, width): 32x32, 24x40, 40x24
    opened = count_opens(monkeypatch, folder)

    def launch() -> list[int]:
        return Bucketed(ImageFolderDataset(folder, 32), table, sizes_dir=sizes_dir).buckets

    first = launch()
    assert first[:3] == [0, 1, 2] and len(opened) >= 30 and len(list(sizes_dir.iterdir())) == 1
    opened.clear()
    assert launch() == first and opened == []  # the next launch
    (folder / "0.png").write_bytes(png_bytes(size=(96, 48)))  # replaced by a landscape image
    stale = next(sizes_dir.iterdir())
    changed = launch()
    assert changed == [1, *first[1:]] and len(opened) >= 30
    assert [index.name for index in sizes_dir.iterdir()] != [stale.name]  # the new index, written...
    assert len(list(sizes_dir.iterdir())) == 1  # ...and the one of the folder before the change deleted
    for index in sizes_dir.iterdir():
        index.write_text("not json")  # a damaged index is read again, never trusted
    assert launch() == changed
    opened.clear()
    assert Bucketed(ImageFolderDataset(folder, 32), table).buckets == changed and len(opened) >= 30  # no folder:
    assert sorted(tmp_path.iterdir()) == [folder, tmp_path / "run"]  # read in memory, nothing written anywhere


@pytest.mark.slow
def test_the_main_process_reads_the_headers_once_and_the_other_reads_its_index(tmp_path):
    write_folder(tmp_path / "images", 30, declare=False)
    torch.multiprocessing.spawn(sizes_on_rank, (str(tmp_path / "images"), str(tmp_path / "rendezvous")), nprocs=2)
    main, other = (json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2))
    assert main["headers"] == 30 and other["headers"] == 0 and main["sizes"] == other["sizes"]


def test_a_mixture_takes_declared_sizes_where_given_and_headers_elsewhere(tmp_path, monkeypatch):
    write_folder(tmp_path / "meta", 6, declare=True)
    write_folder(tmp_path / "bare", 6, declare=False)
    parts = [ImageFolderDataset(tmp_path / name, 32) for name in ("meta", "bare")]
    opened = count_opens(monkeypatch, tmp_path)
    assert image_sizes(MixtureDataset(parts, ["meta", "bare"])) == [CANVASES[i % 3] for i in range(6)] * 2
    assert any("/bare/" in path for path in opened) and not any("/meta/" in path for path in opened)


def test_a_mixture_keeps_an_index_per_part_and_only_the_current_ones(tmp_path):
    """The parts of a mixture share the run's index folder: a change of one part replaces its index, not the other
    part's; a file that is no index is never deleted."""
    for name, count in (("a", 3), ("b", 4)):
        write_folder(tmp_path / name, count, declare=False)
    sizes_dir, table = tmp_path / "run" / "image_sizes", BucketTable(tuple(SIZES))
    sizes_dir.mkdir(parents=True)
    (sizes_dir / "notes.txt").write_text("the user's")

    def launch() -> set[str]:
        mixture = MixtureDataset([ImageFolderDataset(tmp_path / name, 32) for name in ("a", "b")], ["a", "b"])
        Bucketed(mixture, table, sizes_dir=sizes_dir)
        return {path.name for path in sizes_dir.iterdir()}

    first = launch()
    assert len(first) == 3 and "notes.txt" in first
    (tmp_path / "b" / "0.png").write_bytes(png_bytes(size=(96, 48)))
    second = launch()
    assert len(second) == 3 and len(first & second) == 2  # b's index replaced; a's and the user's file kept


def test_a_declared_size_only_picks_the_bucket_and_partial_or_odd_sizes_read_headers(tmp_path, monkeypatch):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "wide.png").write_bytes(png_bytes(size=(96, 48)))
    rows = [{"file_name": "wide.png", "text": "a", "width": 48, "height": 96}]  # declared portrait: wrong
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = BucketTable(tuple(SIZES))
    wrong = Bucketed(ImageFolderDataset(folder, 32), table)
    assert wrong.buckets == [2] and wrong[0]["image"].shape == (3, 40, 24)  # resized to cover, cropped: no failure
    rows += [
        {"file_name": "wide.png", "text": "b"},
        {"file_name": "wide.png", "text": "c", "width": "96", "height": 48},
    ]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    opened = count_opens(monkeypatch, folder)
    assert Bucketed(ImageFolderDataset(folder, 32), table).buckets == [1, 1, 1] and opened  # headers, all of them


def test_hf_integer_width_and_height_columns_spare_the_headers(tmp_path, monkeypatch):
    images = [{"bytes": png_bytes(size=size), "path": None} for size in CANVASES]
    widths, heights = zip(*CANVASES)
    rows = {"image": images, "text": ["a", "b", "c"], "width": list(widths), "height": list(heights)}
    datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image()).save_to_disk(tmp_path / "sized")
    rows |= {"width": [float(w) for w in widths]}  # floats: another meaning, not taken for sizes
    datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image()).save_to_disk(tmp_path / "floats")
    table = BucketTable(tuple(SIZES))
    opened = count_opens(monkeypatch, tmp_path)
    assert Bucketed(HFImageDataset(str(tmp_path / "sized"), 32), table).buckets == [0, 1, 2]
    assert opened == []
    assert Bucketed(HFImageDataset(str(tmp_path / "floats"), 32), table).buckets == [0, 1, 2]
    assert len(opened) == 3
