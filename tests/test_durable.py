"""``durable.publish``: what it puts in place has the modes the user's umask gives new files and folders, whatever
mode its writer chose (safetensors writes 0600; ``tempfile.mkdtemp`` makes 0700 folders)."""

import os
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dit_trainer.durable import publish, umask, write_atomically


@pytest.fixture()
def user_umask():
    """``user_umask(mask)`` sets the process umask for the test; the old one comes back after it."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_published_folders_and_files_follow_the_umask(tmp_path, user_umask, mask, file_mode, folder_mode):
    user_umask(mask)
    assert umask() == mask
    staging = Path(tempfile.mkdtemp(dir=tmp_path))  # 0700, as an export's staging folder
    (staging / "transformer").mkdir()
    save_file({"weight": torch.zeros(2)}, staging / "transformer" / "model.safetensors")
    assert _mode(staging) == 0o700 and _mode(staging / "transformer" / "model.safetensors") == 0o600  # the writers'
    publish(staging, tmp_path / "export")
    export = tmp_path / "export"
    assert {_mode(path) for path in [export, export / "transformer"]} == {folder_mode}
    assert _mode(export / "transformer" / "model.safetensors") == file_mode

    write_atomically(tmp_path / "single.safetensors", lambda path: save_file({"x": torch.zeros(1)}, path))
    assert _mode(tmp_path / "single.safetensors") == file_mode
