"""A run's training data (``data/loading.py``): every process needs one full batch, and a data set smaller than one
is refused before training, whatever its source."""

import pytest

from dit_trainer.errors import ConfigError

from ..conftest import DATA_SMALL, TINY_SHAPES, compose_config, one_paragraph, precompute_cache
from .files import png_bytes


def _tiny_image_folder(root, count: int) -> str:
    for i in range(count):
        (root / f"{i}.png").write_bytes(png_bytes((200, 30, 30), (16, 16)))
    (root / "metadata.jsonl").write_text("".join(f'{{"file_name": "{i}.png", "text": "a red square"}}\n'
                                                 for i in range(count)))  # fmt: skip
    return str(root)


def _small_data(tmp_path, source: str) -> list[str]:
    """Overrides for a data set of 8 (shapes, its disk cache, DP) or 3 (imagefolder) items, batch size 16."""
    if source == "imagefolder":
        folder = tmp_path / "images"
        folder.mkdir()
        return [*TINY_SHAPES, "data=imagefolder", f"data.path={_tiny_image_folder(folder, 3)}", "vae=pixel",
                "data.resolution=16", "data.num_workers=0"]  # fmt: skip
    if source == "cache":
        precompute_cache(compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path / 'cache'}"]))
        return [*DATA_SMALL, f"data.cache_dir={tmp_path / 'cache'}"]
    if source == "dp":
        return ["+experiment=shapes_dp", *TINY_SHAPES[1:], "data.length=8"]
    return DATA_SMALL


@pytest.mark.parametrize("source", ["shapes", "imagefolder", "cache", "dp"])
def test_a_data_set_smaller_than_one_batch_is_refused_before_training(tmp_path, source):
    from dit_trainer.assemble import run

    cfg = compose_config([*_small_data(tmp_path, source), "validation.every_n_steps=500", "validation.split=0.032"])
    with pytest.raises(ConfigError) as caught:
        run(cfg, tmp_path / "run")
    message = one_paragraph(caught.value, "trainer.batch_size")
    size = 2 if source == "imagefolder" else 7  # of 3 or 8: one is held out for validation
    assert f"is 16, but the data set has {size} items to train on (1 more are held out" in message
    assert f"trainer.batch_size={size}" in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_every_process_needs_one_full_batch():
    """Incomplete batches are dropped: fewer items than batch size x processes would leave a process with none."""
    from dit_trainer.data.loading import require_full_batches

    require_full_batches(32, batch_size=16, processes=2)
    with pytest.raises(ConfigError) as caught:
        require_full_batches(20, batch_size=16, processes=2)
    message = str(caught.value)
    assert "`trainer.batch_size` is 16, but the data set has 20 items" in message and "2 processes" in message
    assert "`trainer.batch_size=10`" in message
    with pytest.raises(ConfigError, match="add data"):
        require_full_batches(1, batch_size=4, processes=2)
