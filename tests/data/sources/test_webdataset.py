"""WebDataset tar shards (``data/sources/webdataset.py``): every sample once per epoch across ranks and workers, a
seeded shuffle buffer, corrupt samples and truncated shards skipped and reported, JSON captions, bad paths, shards
from other writers, and clips from video members."""

import io
import logging
import shlex
import tarfile

import pytest
from torch.utils.data import DataLoader

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.moving_shapes import judge
from dit_trainer.data.sources.webdataset import WebDatasetSource, expand_shards
from dit_trainer.errors import ConfigError
from tests.data.files import CORRUPT, assert_in_range, clip_shards, noise_png, png_bytes, write_shards
from tests.data.sources.test_videofolder import write_bad_clips


def _captions(dataset, num_workers: int) -> list[str]:
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_batch, num_workers=num_workers)
    return [caption for batch in loader for caption in batch["caption"]]


@pytest.mark.parametrize("shuffle_buffer", [0, 4])
def test_webdataset_shards_split_over_ranks_and_workers_cover_every_sample_once(tmp_path, shuffle_buffer):
    png = png_bytes()
    shards = [[{"__key__": f"s{s}_{i}", "png": png, "txt": f"s{s}_{i}"} for i in range(3)] for s in range(8)]
    pattern = write_shards(tmp_path, shards)
    everything = sorted(sample["txt"] for shard in shards for sample in shard)
    ranks = [WebDatasetSource(pattern, 8, rank=rank, world_size=2, shuffle_buffer=shuffle_buffer) for rank in range(2)]
    orders = []
    for epoch in range(2):
        seen = []
        for dataset in ranks:
            dataset.set_epoch(epoch)
            seen.extend(_captions(dataset, num_workers=2))
        assert sorted(seen) == everything  # every sample exactly once per epoch
        orders.append(seen)
    assert orders[0] != orders[1]  # the same set in another order
    assert [c for dataset in ranks for c in _captions(dataset, num_workers=2)] == orders[1]  # and repeatable


def test_webdataset_shuffle_buffer_reorders_samples_within_a_shard(tmp_path):
    samples = [{"__key__": f"k{i:02d}", "png": png_bytes(), "txt": f"k{i:02d}"} for i in range(12)]
    pattern = write_shards(tmp_path, [samples])
    in_tar_order = [s["txt"] for s in samples]
    assert _captions(WebDatasetSource(pattern, 8), num_workers=0) == in_tar_order
    shuffled = WebDatasetSource(pattern, 8, shuffle_buffer=4)
    first = _captions(shuffled, num_workers=0)
    assert first != in_tar_order and sorted(first) == in_tar_order
    assert _captions(shuffled, num_workers=0) == first  # seeded: a resumed run reads the same order
    shuffled.set_epoch(1)
    assert _captions(shuffled, num_workers=0) != first


def test_webdataset_skips_corrupt_samples_and_truncated_shards(tmp_path):
    good = [{"__key__": f"good{i}", "png": noise_png(i), "txt": f"good {i}"} for i in range(3)]
    corrupt = [
        {"__key__": name.split(".")[0], name.split(".")[1]: data, "txt": name}
        for name, data in CORRUPT.items()
        if data is not None
    ]
    no_image = [{"__key__": "missing", "txt": "a sample whose image file is missing"}]
    cut = [{"__key__": f"cut{i}", "png": noise_png(i), "txt": f"cut {i}"} for i in range(3)]
    pattern = write_shards(tmp_path, [good[:1] + corrupt + good[1:2], no_image + good[2:], cut])
    whole = (tmp_path / "000001.tar").read_bytes()
    (tmp_path / "000001.tar").write_bytes(whole[: len(whole) // 2])  # cut inside good2's image
    whole = (tmp_path / "000002.tar").read_bytes()
    headers = [at for at in range(0, len(whole), 512) if whole[at + 257 : at + 262] == b"ustar"]
    cut_at = max(at for at in headers if at < whole.index(b"cut2"))  # cut2's first header block
    (tmp_path / "000002.tar").write_bytes(whole[:cut_at])  # an interrupted copy: it ends where a tar could end
    dataset = WebDatasetSource(pattern, 16, seed=0)
    dataset.set_epoch(0)
    batches = list(DataLoader(dataset, batch_size=8, collate_fn=collate_batch, num_workers=0))
    assert len(batches) == 1
    batch = batches[0]
    assert sorted(batch["caption"]) == ["cut 0", "good 0", "good 1"]  # cut1 went with the end it was read with
    for image in batch["image"]:
        assert_in_range(image, 16)
    bad = batch["bad_files"]
    assert len(bad) == 6, bad
    assert any("000002.tar:cut1: ReadError: no end-of-archive marker" in record for record in bad)
    assert any("000000.tar:truncated: OSError" in record for record in bad)
    assert any("000000.tar:empty: ValueError: empty file" in record for record in bad)
    assert any("000000.tar:text: not an image" in record for record in bad)
    assert any("000001.tar:missing: ValueError: no image member (it has txt)" in record for record in bad)
    assert any("000001.tar:good2: ReadError" in record for record in bad)


def test_webdataset_json_captions_and_caption_columns(tmp_path):
    samples = [
        {"__key__": f"k{i}", "jpg": png_bytes(), "json": {"short": "red", "long": "a red box"}} for i in range(2)
    ]
    pattern = write_shards(tmp_path, [samples])
    dataset = WebDatasetSource(pattern, 8, caption_columns=["short", "long"], crop="random", horizontal_flip=True)
    captions = set()
    for epoch in range(20):  # each sample draws its caption from its own seed and the epoch
        dataset.set_epoch(epoch)
        captions |= {item["caption"] for item in dataset}
    assert captions == {"red", "a red box"}
    assert [item["caption"] for item in dataset] == [item["caption"] for item in dataset]  # the same draw again
    assert next(iter(WebDatasetSource(pattern, 8, caption_column="long")))["caption"] == "a red box"
    with pytest.raises(
        ConfigError, match=r"data.caption_column.*2 samples .* have no caption 'txt', only \['long', 'sh"
    ):
        WebDatasetSource(pattern, 8, caption_column="txt")


def test_a_first_sample_without_its_caption_is_skipped_and_counted_not_taken_for_a_wrong_caption_column(tmp_path):
    samples = [{"__key__": "bare", "png": png_bytes()}]
    samples += [{"__key__": f"k{i}", "png": png_bytes(), "txt": f"caption {i}"} for i in range(3)]
    dataset = WebDatasetSource(write_shards(tmp_path, [samples]), 8, caption_column="txt")
    items = list(dataset)
    assert [item["caption"] for item in items] == ["caption 0", "caption 1", "caption 2"]
    assert items[0]["bad_files"] == [f"{tmp_path / '000000.tar'}:bare: ValueError: no caption 'txt'"]


def test_webdataset_bad_paths_name_data_path_and_few_shards_warn(tmp_path, caplog):
    pattern = write_shards(tmp_path, [[{"__key__": "a", "png": png_bytes(), "txt": "a"}]] * 2)
    with pytest.raises(ConfigError, match=r"data.path.*2 of its 4 shards do not exist"):
        WebDatasetSource(pattern.replace("000001", "000003"), 8)
    with pytest.raises(ConfigError, match=r"data.path.*names no shards"):
        WebDatasetSource("", 8)
    (tmp_path / "broken.tar").write_bytes(b"not a tar archive" * 100)
    with_broken = WebDatasetSource(f"{{{pattern},{tmp_path}/broken.tar}}", 8)
    batch = next(iter(DataLoader(with_broken, batch_size=2, collate_fn=collate_batch)))
    assert batch["caption"] == ["a", "a"] and batch["bad_files"] == [
        f"{tmp_path}/broken.tar: ReadError: invalid header"
    ]
    with caplog.at_level(logging.WARNING):
        assert [item["caption"] for item in WebDatasetSource(pattern, 8, rank=2, world_size=3)] == []
    assert "2 shards for 3 ranks x 1 workers" in caplog.text


def test_tar_written_with_tarfile_reads_too(tmp_path):
    """Shards from other writers (plain tar, folders inside, upper-case extensions) follow the same convention."""
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:
        for name, data in [("dir/x.JPG", png_bytes()), ("dir/x.txt", b"in a folder")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert [item["caption"] for item in WebDatasetSource(str(tmp_path / "plain.tar"), 8)] == ["in a folder"]


def test_webdataset_captions_that_are_not_utf8_or_not_objects_are_skipped_and_counted(tmp_path):
    samples = [{"__key__": "latin", "png": png_bytes(), "txt": "\xe9t\xe9".encode("latin-1")},
               {"__key__": "number", "png": png_bytes(), "json": b"42"},
               {"__key__": "good", "png": png_bytes(), "txt": "good"}]  # fmt: skip
    items = list(WebDatasetSource(write_shards(tmp_path, [samples]), 8))
    assert [i["caption"] for i in items] == ["good"]
    assert [record.split(": ", 1)[1] for record in items[0]["bad_files"]] == [
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in position 0: invalid continuation byte",
        "ValueError: the .json member is a JSON number, not an object",
    ]


def test_the_fix_for_a_shard_pattern_shows_the_quoting_a_shell_passes_to_hydra():
    """Audit F14: `data.path='/d/{0..9}.tar'` typed in bash reaches Hydra without its quotes, and Hydra stops at
    the brace; the whole override in double quotes passes the single-quoted pattern on."""
    with pytest.raises(ConfigError) as caught:
        WebDatasetSource("", 8)
    example = str(caught.value).rpartition("e.g. `")[2].removesuffix("`.")
    assert shlex.split(example) == ["data.path='/data/shards/{000000..000099}.tar'"]


def test_video_members_give_clips_cut_alike_and_bad_ones_are_skipped_and_counted(tmp_path):
    """Clips from the shards' .mp4 members read back as written (the judge reads every colour, shape and direction);
    a truncated, empty, too short, text or audio-only member is skipped and counted, the image members ignored."""
    write_bad_clips(tmp_path / "bad")
    bad = {name: (tmp_path / "bad" / f"{name}.mp4").read_bytes() for name in ("truncated", "empty", "short", "text")}
    bad["audio"] = (tmp_path / "bad" / "audio.mp4").read_bytes()
    extra = [{"__key__": name, "mp4": data, "txt": name} for name, data in bad.items()]
    extra.append({"__key__": "still", "png": png_bytes(), "txt": "an image, no clip"})
    pattern = clip_shards(tmp_path / "clips", 8, extra)
    dataset = WebDatasetSource(pattern, 32, frames=5, crop="random", horizontal_flip=False)
    batches = list(DataLoader(dataset, batch_size=16, collate_fn=collate_batch, num_workers=0))
    assert len(batches) == 1 and batches[0]["image"].shape == (8, 3, 5, 32, 32)
    clips = batches[0]["image"].float() / 255
    assert judge(clips, batches[0]["caption"]) == {"color": 1.0, "shape": 1.0, "direction": 1.0}
    skipped = sorted(record.split(":")[1] for record in batches[0]["bad_files"])
    assert skipped == sorted([*bad, "still"]), batches[0]["bad_files"]
    assert "no video member (it has png, txt)" in " ".join(batches[0]["bad_files"])
    assert [item["image"].shape for item in dataset][:1] == [(3, 5, 32, 32)]


def test_a_folder_as_data_path_is_named_as_a_folder_not_a_missing_shard(tmp_path):
    """It said "1 of its 1 shards do not exist" of a folder that exists."""
    with pytest.raises(ConfigError, match=r"`data.path` is .*is a folder, and webdataset reads tar shards"):
        expand_shards(str(tmp_path))


def test_fewer_shards_than_processes_are_refused_before_training(tmp_path):
    """A process without a shard could never give a batch: it failed in the first step, on that process only."""
    pattern = write_shards(tmp_path, [[{"__key__": "a", "png": png_bytes(), "txt": "a"}]])
    WebDatasetSource(pattern, resolution=8, caption_column="txt", rank=0, world_size=1).check_shares()
    with pytest.raises(ConfigError, match=r"`data.path` is .*1 shards for 2 processes.*1 would have none"):
        WebDatasetSource(pattern, resolution=8, caption_column="txt", rank=0, world_size=2).check_shares()
