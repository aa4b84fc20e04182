"""The video folder source (``data=videofolder``): clips decoded with PyAV to ``data.frames`` frames (at the file's
rate or resampled to ``data.fps``), cut alike; metadata.jsonl or sidecar captions; bad clips (truncated, no frames,
too short, not a video, audio only) skipped and counted; a folder with no usable clip refused in one paragraph."""

import json

import av
import numpy as np
import pytest
import torch

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.moving_shapes import judge, write_moving_shapes_folder
from dit_trainer.data.sources.videofolder import VideoFolderDataset, check_video_folder, decode_clip, write_mp4
from dit_trainer.errors import ConfigError

from ...conftest import one_paragraph


def counting_clip(path, frames: int, fps: float = 8) -> None:
    """A clip whose frame k is grey level 10 k (readable back through H.264 within a few levels)."""
    pixels = np.stack([np.full((16, 16, 3), 10 * k, dtype=np.uint8) for k in range(frames)])
    write_mp4(pixels, path, fps)


def levels(frames: list[np.ndarray]) -> list[int]:
    return [round(float(frame.mean()) / 10) for frame in frames]


def test_frames_are_consecutive_or_resampled_from_a_drawn_start(tmp_path):
    counting_clip(tmp_path / "c.mp4", 20, fps=8)
    torch.manual_seed(0)
    starts = set()
    for _ in range(8):
        with (tmp_path / "c.mp4").open("rb") as file:
            got = levels(decode_clip(file, 5, None))
        assert got == list(range(got[0], got[0] + 5))
        starts.add(got[0])
    assert len(starts) > 1 and max(starts) <= 15  # the start is drawn, and the clip fits
    with (tmp_path / "c.mp4").open("rb") as file:
        halved = levels(decode_clip(file, 5, 4))  # 4 fps from 8: every other frame
    assert np.diff(halved).tolist() == [2, 2, 2, 2]


def test_a_clip_is_cut_alike_frame_by_frame_and_items_batch(tmp_path):
    folder = write_moving_shapes_folder(tmp_path / "clips", 8, frames=5, resolution=32)
    dataset = VideoFolderDataset(folder, resolution=16, frames=5, crop="random", horizontal_flip=True)
    items = [dataset[i] for i in range(len(dataset))]
    assert all(item["image"].shape == (3, 5, 16, 16) and item["image"].dtype == torch.uint8 for item in items)
    batch = collate_batch(items)
    assert batch["image"].shape == (8, 3, 5, 16, 16) and batch["bad_files"] == []
    full = VideoFolderDataset(folder, resolution=32, frames=5)
    clips = torch.stack([full[i]["image"] for i in range(8)]).float() / 255
    scores = judge(clips, [full[i]["caption"] for i in range(8)])  # what was written reads back through H.264
    assert scores == {"color": 1.0, "shape": 1.0, "direction": 1.0}


def test_sidecar_captions_stand_in_for_metadata(tmp_path):
    counting_clip(tmp_path / "a.mp4", 6)
    (tmp_path / "a.txt").write_text("a grey fade\n")
    counting_clip(tmp_path / "uncaptioned.mp4", 6)
    check_video_folder(str(tmp_path))
    dataset = VideoFolderDataset(tmp_path, resolution=16, frames=3)
    assert len(dataset) == 1 and dataset[0]["caption"] == "a grey fade"


def test_a_clips_size_is_declared_or_read_from_its_header(tmp_path):
    """What buckets sort by, without decoding a frame: the metadata's width and height on every line, else each
    clip's header (None for an unreadable one, skipped when its turn comes)."""
    write_mp4(np.zeros((3, 16, 24, 3), dtype=np.uint8), tmp_path / "wide.mp4", 8)
    (tmp_path / "text.mp4").write_text("not a video")
    lines = [{"file_name": "wide.mp4", "text": "w"}, {"file_name": "text.mp4", "text": "t"}]
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    read = VideoFolderDataset(tmp_path, resolution=16, frames=3)
    assert read.declared_sizes() is None and [read.image_size(i) for i in range(2)] == [(24, 16), None]
    declared = [line | {"width": 48, "height": 32} for line in lines]
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in declared))
    assert VideoFolderDataset(tmp_path, resolution=16, frames=3).declared_sizes() == [(48, 32), (48, 32)]


def write_bad_clips(folder) -> list[str]:
    """Good clips among a truncated MP4, a zero-frame one, one too short, a text file named .mp4 and an audio-only
    file; the bad names."""
    folder.mkdir()
    for name in ("good0", "good1", "short"):
        counting_clip(folder / f"{name}.mp4", 3 if name == "short" else 8)
    whole = (folder / "good0.mp4").read_bytes()
    (folder / "truncated.mp4").write_bytes(whole[: len(whole) // 3])
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "text.mp4").write_text("this is not a video\n")
    with av.open(str(folder / "audio.mp4"), mode="w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    bad = ["truncated", "empty", "short", "text", "audio"]
    names = ["good0", *bad, "good1"]
    (folder / "metadata.jsonl").write_text(
        "".join(json.dumps({"file_name": f"{n}.mp4", "text": n}) + "\n" for n in names)
    )
    return [f"{name}.mp4" for name in bad]


def test_bad_clips_are_skipped_and_counted(tmp_path):
    bad = write_bad_clips(tmp_path / "clips")
    dataset = VideoFolderDataset(tmp_path / "clips", resolution=16, frames=5)
    items = [dataset[i] for i in range(len(dataset))]
    assert {item["caption"] for item in items} == {"good0", "good1"}
    records = [record for item in items for record in item.get("bad_files", [])]  # each names its own clip
    assert [record.split(":")[0] for record in records] == bad, records
    assert "fewer" in " ".join(records)  # the short clip says why


def test_a_folder_with_no_usable_clip_is_refused_in_one_paragraph(tmp_path):
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "text.mp4").write_text("not a video")
    (folder / "metadata.jsonl").write_text(json.dumps({"file_name": "text.mp4", "text": "x"}) + "\n")
    with pytest.raises(ConfigError) as refused:
        VideoFolderDataset(folder, resolution=16, frames=5)[0]
    assert refused.value.key == "data.path" and "unreadable" in str(refused.value)
    with pytest.raises(ConfigError, match="metadata.jsonl"):
        check_video_folder(str(tmp_path / "nothing"))


def test_clips_all_too_short_for_data_frames_are_refused_naming_it_not_the_files(tmp_path):
    """Every clip readable but shorter than a clip of 13 frames needs: the fault is `data.frames` (it said to check
    that `data.path` points at complete files)."""
    folder = tmp_path / "clips"
    folder.mkdir()
    for index in range(3):
        counting_clip(folder / f"{index}.mp4", frames=5)
    (folder / "metadata.jsonl").write_text("".join(json.dumps({"file_name": f"{i}.mp4", "text": "x"}) + "\n"
                                                   for i in range(3)))  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        VideoFolderDataset(folder, resolution=16, frames=13)[0]
    message = one_paragraph(refused.value, "data.frames")
    assert "none of the last 3 files fits it" in message and "fewer than the 13 a clip of 13 needs" in message
    assert "To fix it, lower `data.frames` to fit the clips (or set `data.fps` nearer their own rate, 8 fps" in message


@pytest.mark.slow
def test_a_run_trains_on_the_readable_clips_and_writes_only_its_folder(tmp_path):
    """train.py's run (in this process) on a folder with every kind of bad clip: it trains, counts them
    (data/skipped), and leaves the data folder as it was."""
    from tests.e2e.family_runs import train_in_process

    write_bad_clips(tmp_path / "clips")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "clips").iterdir())
    run_dir = train_in_process(
        tmp_path / "run", "+experiment=moving_shapes", "data=videofolder", f"data.path={tmp_path / 'clips'}",
        "data.frames=5", "data.resolution=16", "data.cache_latents=false", "data.num_workers=0",
        "data.max_bad_fraction=0.9", "trainer.max_steps=3", "trainer.batch_size=2", "trainer.sample_every=0",
        "trainer.log_every=1", "monitor.reward.enabled=false", "validation.every_n_steps=0",
        "model.extra_config.patch_size=[1,4,4]", base=(),
    )  # fmt: skip
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert max(r.get("data/skipped", 0) for r in records) >= 3  # the bad clips the 6 items met
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "clips").iterdir()) == before
