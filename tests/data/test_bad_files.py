"""Skipped files counted (``data/bad_files.py``): too many stop the run naming the setting that chose the data."""

import pytest
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from dit_trainer.config import DataConfig
from dit_trainer.data.bad_files import BadFileCounter, PassBadFiles
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.imagefolder import ImageFolderDataset
from dit_trainer.errors import ConfigError

from ..conftest import one_paragraph
from .files import image_folder, png_bytes


@pytest.mark.parametrize(
    ("path", "sources", "key", "value"),
    [("/data", [], "data.path", "'/data'"), (None, ["shapes", "photos"], "data.mixture", "{'photos': 6}")],
    ids=["one-source", "mixture"],
)
def test_too_many_skipped_files_name_the_setting_that_chose_the_data(path, sources, key, value):
    """A mixture's `data.path` is unset: its message names `data.mixture` and the sources that skipped files."""
    counter = BadFileCounter(0.1, path, sources, Accelerator(cpu=True))
    records = [f"[photos] {i}.png: file not found" if sources else f"{i}.png: file not found" for i in range(6)]
    counter.add({"caption": ["a picture"] * 10, "bad_files": records})
    with pytest.raises(ConfigError) as caught:
        counter.check()
    message = one_paragraph(caught.value, key)
    assert f"`{key}` is {value}" in message and "6 of the 16 files read so far" in message
    assert ("`data.path`" in message) == (key == "data.path")


def test_a_resumed_counter_counts_on_from_its_checkpoint(tmp_path):
    """Saved per process as a checkpoint saves it (``torch.save``, read back with ``weights_only``); a source added
    to the mixture at the resume starts at 0."""
    counter = BadFileCounter(0.5, None, ["shapes", "photos"])
    counter.add({"caption": ["a"] * 8, "bad_files": ["[photos] 1.png: truncated", "[photos] 2.png: truncated"]})
    torch.save(counter.state_dict(), tmp_path / "bad_files_0.pt")
    resumed = BadFileCounter(0.5, None, ["shapes", "photos", "added"])
    resumed.load_state_dict(torch.load(tmp_path / "bad_files_0.pt", weights_only=True))
    resumed.add({"caption": ["a"] * 4, "bad_files": ["[shapes] 9.png: empty"]})
    assert resumed.check() == {
        "data/skipped": 3,
        "data/skipped/shapes": 1,
        "data/skipped/photos": 2,
        "data/skipped/added": 0,
    }
    assert resumed.read == 15 and resumed.first == ["[photos] 1.png: truncated", "[photos] 2.png: truncated",
                                                     "[shapes] 9.png: empty"]  # fmt: skip


def test_a_pass_counts_each_file_once_against_the_whole_data_set():
    """Precompute reads in order: six unreadable headers, all in the squarest bucket, come in one batch, and a run
    of them is tried again as each other's stand-in. 6 of 1000 is within 1 %; 11 of 1000 is not."""
    data = DataConfig(source="imagefolder", path="/data", max_bad_fraction=0.01)
    records = [f"{i}.png: truncated" for i in range(6)]
    within = PassBadFiles(data, total=1000)
    within.add({"caption": ["a"] * 10, "bad_files": records + records[1:] + records[2:]})
    assert within.finish() == records
    over = PassBadFiles(data, total=1000)
    with pytest.raises(ConfigError, match=r"11 of the data set's 1000 files \(1%\) are unreadable.*the first: 0\.png"):
        over.add({"caption": ["a"] * 10, "bad_files": [f"{i}.png: truncated" for i in range(11)]})


def test_a_cluster_of_bad_files_counts_each_once_an_epoch(tmp_path):
    """5 unreadable files in a row among 40 (12.5 %): a shuffled epoch reads each once, and a limit of 20 % holds.
    Counting the stand-ins tried for an item too (each bad file once more for every bad one before it) made 8 of 24
    and stopped the run."""
    files = {f"{i:02d}.png": b"" if 10 <= i < 15 else png_bytes() for i in range(40)}
    image_folder(tmp_path, [{"file_name": name, "text": name} for name in files], files)
    loader = DataLoader(ImageFolderDataset(tmp_path, resolution=8), batch_size=8, shuffle=True,
                        collate_fn=collate_batch)  # fmt: skip
    counter = BadFileCounter(0.2, str(tmp_path))
    for batch in loader:
        counter.add(batch)
    assert counter.check() == {"data/skipped": 5}
