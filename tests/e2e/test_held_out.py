"""Held-out means held out, on every path: the images validation holds out, the images FID compares samples with,
and the images trained on are compared by content (each image's caption is its own), for a bucketed latent cache
written by two processes, a source with unreadable files on both sides of the split, and a mixture."""

from itertools import islice
from pathlib import Path

import pytest
import torch
from PIL import Image

from dit_trainer.assemble import build_trainer
from dit_trainer.components.vae import PixelVAE
from dit_trainer.data.split import split_indices, validation_images
from dit_trainer.rewards.fid import LatentFeatures, validation_reference

from ..conftest import CPU_PROCESSES, TINY_SHAPES, accelerate_launch, compose_config, run_script, validation_monitor
from ..data.files import BUCKETS, CANVASES, captioned_folder, photos_folder

pytestmark = pytest.mark.slow  # precomputes with two processes, builds trainers

SPLIT = ("validation.every_n_steps=10", "validation.split=0.25", "trainer.sample_every=0")


def mixed_aspect_folder(folder: Path, count: int) -> Path:
    """``count`` images on the canvases of three buckets in turn, each captioned ``image <i>``."""
    folder.mkdir()
    rows = []
    for i in range(count):
        width, height = CANVASES[i % len(CANVASES)][::-1]
        Image.new("RGB", (width, height), (i * 6, 255 - i * 6, 128)).save(folder / f"{i}.png")
        rows.append(f'{{"file_name": "{i}.png", "text": "image {i}"}}\n')
    (folder / "metadata.jsonl").write_text("".join(rows))
    return folder


def sides(overrides: list[str], tmp_path: Path, epochs: int = 3) -> tuple[set[str], set[str], set[str]]:
    """(validated, FID's reference, trained on) captions of the run ``overrides`` configure."""
    cfg = compose_config(overrides)
    trainer = build_trainer(cfg, tmp_path / "run")
    validated = {caption for batch in validation_monitor(trainer).batches for caption in batch["caption"]}
    reference = {item["caption"] for item in validation_images(cfg.data, cfg.validation)}
    steps = epochs * len(trainer.step.dataloader)
    trained = {caption for batch in islice(trainer.step.batches(), steps) for caption in batch["caption"]}
    return validated, reference, trained


def test_a_bucketed_cache_written_by_two_processes_holds_out_what_fid_compares_with(tmp_path):
    """Precompute writes a bucketed cache bucket by bucket and a share per process, so row k is not image k: the
    rows held out are those of the held-out images, the ones FID's reference reads from the source."""
    folder = mixed_aspect_folder(tmp_path / "images", 48)
    overrides = [*TINY_SHAPES, "data=imagefolder", f"data.path={folder}", "data.resolution=32", "data.num_workers=0",
                 BUCKETS, "trainer.batch_size=4", f"data.cache_dir={tmp_path / 'cache'}", "data.cache_dtype=float32",
                 *SPLIT]  # fmt: skip
    result = run_script([*accelerate_launch(), "scripts/precompute.py", *overrides], env=CPU_PROCESSES)
    assert result.returncode == 0, result.stderr[-3000:]
    validated, reference, trained = sides(overrides, tmp_path)
    assert len(validated) == 12 and validated == reference
    assert not validated & trained and validated | trained == {f"image {i}" for i in range(48)}


def test_an_unreadable_image_is_replaced_from_its_own_side_of_the_split(tmp_path):
    """An unreadable training image just before a held-out one, and an unreadable held-out image just before a
    training one: each replacement comes from its own side."""
    folder = tmp_path / "images"
    captioned_folder(folder, 40)
    train, held_out = split_indices(40, 0.25, 0)
    before_held = next(i for i in train if i + 1 in held_out)
    before_train = next(i for i in held_out if i + 1 in train)
    for index in (before_held, before_train):
        (folder / f"{index}.png").write_bytes((folder / f"{index}.png").read_bytes()[:40])
    overrides = [*TINY_SHAPES, "data=imagefolder", f"data.path={folder}", "data.resolution=32", "data.num_workers=0",
                 "trainer.batch_size=4", *SPLIT]  # fmt: skip
    validated, reference, trained = sides(overrides, tmp_path)
    assert validated == reference and not validated & trained
    assert validated <= {f"image {i}" for i in held_out} and trained <= {f"image {i}" for i in train}


def test_a_mixture_holds_out_the_same_images_for_validation_and_fid(tmp_path):
    """Two image folders mixed 3:1, one with two unreadable files."""
    captioned_folder(tmp_path / "images", 36)
    photos_folder(tmp_path / "photos", 18, bad=2)
    mixture = (f"data.mixture=[{{source:imagefolder,path:{tmp_path / 'images'},weight:3}},"
               f"{{source:imagefolder,path:{tmp_path / 'photos'},name:photos}}]")  # fmt: skip
    overrides = [*TINY_SHAPES, mixture, "data.resolution=32", "data.num_workers=0", "trainer.batch_size=4", *SPLIT]
    validated, reference, trained = sides(overrides, tmp_path, epochs=4)
    # 14 of the 56 held out; one of them is unreadable, replaced by another held-out photo
    assert len(validated) == 13 and validated == reference and not validated & trained


def test_two_mixtures_sharing_the_reference_cache_each_get_their_own_fid_reference(tmp_path):
    """The reference features are cached under a fingerprint of every mixture entry and its content: a second
    mixture (other photos, the same cache folder) computes its own instead of reading the first one's."""
    captioned_folder(tmp_path / "images", 24)
    references = []
    for name in ("photos", "snaps"):
        photos_folder(tmp_path / name, 8)
        if name == "snaps":  # same file names, other images and captions
            rows = (tmp_path / name / "metadata.jsonl").read_text().replace('"photo ', '"snap ')
            (tmp_path / name / "metadata.jsonl").write_text(rows)
        mixture = (f"data.mixture=[{{source:imagefolder,path:{tmp_path / 'images'}}},"
                   f"{{source:imagefolder,path:{tmp_path / name}}}]")  # fmt: skip
        cfg = compose_config([*TINY_SHAPES, mixture, "data.resolution=32", "trainer.batch_size=4", *SPLIT])
        extractor = LatentFeatures(PixelVAE(), {"kind": "pixel"})
        reference = validation_reference(
            cfg.data, cfg.validation, extractor, str(tmp_path / "fid_cache"), torch.device("cpu"), 8
        )
        own = [item["caption"] for item in validation_images(cfg.data, cfg.validation)]
        assert reference.captions == own
        references.append(set(own))
    assert references[0] != references[1]
