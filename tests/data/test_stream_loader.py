"""A stream's loader (``data/stream_loader.py``) over webdataset shards: a restored position continues the batches
exactly, decoding only what it trains on (and the one item the stream holds back); a position saved with another
number of workers, another shard list or on rewritten shards is refused in the main process, or with the change
allowed starts its epoch again on the current shards."""

import io
import logging
import os
import tarfile

import pytest
import torch

import dit_trainer.data.sources.webdataset as webdataset_module
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.webdataset import WebDatasetSource
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.errors import ConfigError
from dit_trainer.training.batches import resumable_batches

from .files import captioned_shards, clip_shards, noise_png


def _loader(pattern: str, workers: int = 0, allow_change: bool = False) -> StreamLoader:
    source = WebDatasetSource(pattern, 8, "txt", crop="random", horizontal_flip=True, shuffle_buffer=6)
    return StreamLoader(source, allow_change, batch_size=4, drop_last=True, collate_fn=collate_batch,
                        num_workers=workers)  # fmt: skip


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


def test_a_restored_clip_stream_continues_exactly(tmp_path):
    """Video shards resume like image shards: the clips' drawn start frames, crops and flips included."""
    pattern = clip_shards(tmp_path / "shards", 24, shards=3, frames=8)  # 5 of 8 frames: the start is drawn

    def loader() -> StreamLoader:
        source = WebDatasetSource(pattern, 16, "txt", crop="random", horizontal_flip=True, shuffle_buffer=4, frames=5)
        return StreamLoader(source, False, batch_size=4, drop_last=True, collate_fn=collate_batch, num_workers=0)

    straight = _batches(loader(), 9)  # 6 batches an epoch: into epoch 1
    interrupted = loader()
    _batches(interrupted, 4)
    restored = loader()
    restored.load_state_dict(interrupted.state_dict())
    for (captions, clips), (expected_captions, expected_clips) in zip(_batches(restored, 5), straight[4:], strict=True):
        assert clips.shape == (4, 3, 5, 16, 16)
        assert captions == expected_captions and torch.equal(clips, expected_clips)


def test_a_position_saved_with_other_workers_is_refused(tmp_path):
    pattern = captioned_shards(tmp_path / "shards", 2, 4)
    saved = _loader(pattern)
    _batches(saved, 1)
    with pytest.raises(ConfigError, match=r"`data.num_workers` is 2.*saved with `data.num_workers=0`"):
        _loader(pattern, workers=2).load_state_dict(saved.state_dict())


def _saved_position(loader: StreamLoader, batches: int, path) -> dict:
    """The position after ``batches`` batches, through a file as a checkpoint holds it."""
    _batches(loader, batches)
    torch.save(loader.state_dict(), path)
    return torch.load(path, weights_only=True)


def test_a_position_on_rewritten_shards_is_refused_before_the_workers_start(tmp_path):
    """Audit F6: the shards rewritten with other images of the same names, byte sizes and modification times."""
    pattern = captioned_shards(tmp_path / "shards", 2, 6)
    state = _saved_position(_loader(pattern, workers=1), 2, tmp_path / "position.pt")
    for shard in (tmp_path / "shards").glob("*.tar"):
        before = shard.stat()
        with tarfile.open(shard) as tar:
            members = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]
        with tarfile.open(shard, "w") as tar:
            for number, (info, data) in enumerate(members):  # other noise PNGs, of the same byte length
                tar.addfile(info, io.BytesIO(data if info.name.endswith(".txt") else noise_png(1000 + number)))
        os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert shard.stat().st_size == before.st_size
    with pytest.raises(ConfigError, match=r"`data.path` .* stream position was saved on other data .*000000.tar "
                                          r"\(other first bytes\).*allow_config_change=true"):  # fmt: skip
        _loader(pattern, workers=1).load_state_dict(state)


def test_with_the_change_allowed_another_shard_list_starts_the_saved_epoch_from_its_start(tmp_path, caplog):
    """Audit F9 (4 shards -> 3 with `trainer.allow_config_change=true` was an IndexError in the worker): the
    position, saved in epoch 1, is refused without the permission and restarts epoch 1 on the new list with it."""
    pattern = captioned_shards(tmp_path / "shards", 4, 4)  # 4 batches an epoch
    state = _saved_position(_loader(pattern, workers=1), 6, tmp_path / "position.pt")
    assert state["epoch"] == 1
    fewer = pattern.replace("000003", "000002")
    with pytest.raises(ConfigError, match=r"another shard list or order \(4 shards at the checkpoint, 3 now\)"):
        _loader(fewer, workers=1).load_state_dict(state)
    restarted = _loader(fewer, workers=1, allow_change=True)
    with caplog.at_level(logging.WARNING):
        restarted.load_state_dict(state)
    assert "starts its epoch again on the current data" in caplog.text
    fresh = _loader(fewer, workers=1)
    fresh.dataset.set_epoch(1)
    expected = [batch["caption"] for batch in fresh]
    continued = resumable_batches(restarted, None, 0)
    assert [next(continued)["caption"] for _ in expected] == expected  # all of epoch 1 of the 3 shards
