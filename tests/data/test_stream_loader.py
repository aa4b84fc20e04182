"""A stream's loader (``data/stream_loader.py``) over webdataset shards: a restored position continues the batches
exactly, decoding only what it trains on (and the one item the stream holds back), and a position saved with
another number of workers is refused."""

import pytest
import torch

import dit_trainer.data.webdataset as webdataset_module
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.data.webdataset import WebDatasetSource
from dit_trainer.errors import ConfigError
from dit_trainer.training.batches import resumable_batches

from .files import captioned_shards


def _loader(pattern: str, workers: int = 0) -> StreamLoader:
    source = WebDatasetSource(pattern, 8, "txt", crop="random", horizontal_flip=True, shuffle_buffer=6)
    return StreamLoader(source, batch_size=4, drop_last=True, collate_fn=collate_batch, num_workers=workers)


def _batches(loader: StreamLoader, count: int) -> list[tuple[list[str], torch.Tensor]]:
    batches = resumable_batches(loader, None, 0)
    return [(batch["caption"], batch["image"]) for batch in (next(batches) for _ in range(count))]


def test_a_restored_stream_continues_exactly_and_decodes_only_what_it_trains_on(tmp_path, monkeypatch):
    pattern = captioned_shards(tmp_path / "shards", 4, 25)  # 100 samples: 25 batches an epoch
    straight = _batches(_loader(pattern), 30)
    decodes = []
    decode = webdataset_module.decode_image
    monkeypatch.setattr(webdataset_module, "decode_image", lambda data: decodes.append(1) or decode(data))
    interrupted = _loader(pattern)
    _batches(interrupted, 22)  # into the last shard of epoch 0
    torch.save(interrupted.state_dict(), tmp_path / "position.pt")  # as a checkpoint holds it
    state = torch.load(tmp_path / "position.pt", weights_only=True)
    decodes.clear()
    restored = _loader(pattern)
    restored.load_state_dict(state)
    continued = _batches(restored, 8)  # the rest of epoch 0 and into epoch 1
    assert len(decodes) == 8 * 4 + 1  # the batches' images and the held-back item's, decoded again
    for (captions, images), (expected_captions, expected_images) in zip(continued, straight[22:]):
        assert captions == expected_captions and torch.equal(images, expected_images)


def test_a_position_saved_with_other_workers_is_refused(tmp_path):
    pattern = captioned_shards(tmp_path / "shards", 2, 4)
    saved = _loader(pattern)
    _batches(saved, 1)
    with pytest.raises(ConfigError, match=r"`data.num_workers` is 2.*saved with `data.num_workers=0`"):
        _loader(pattern, workers=2).load_state_dict(saved.state_dict())
