"""Durable writes: after a crash, a kill or a power loss, a file or folder is either the old one or the complete new
one, never a torn mix. Data reaches the disk (``fsync``) before the rename that publishes it, and the rename itself
is made durable by syncing the folder that holds it.

What is published gets the modes the user's umask gives a plain ``open``/``mkdir`` (0644 files and 0755 folders under
umask 022): some writers create private files whatever the umask (safetensors 0.8 and every ``save_pretrained``
built on it write 0600; ``tempfile.mkdtemp`` makes 0700 folders), and a folder published by a rename keeps its
staging mode, so teammates on shared storage could not read a run's weights or its export."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder``, and ``folder`` itself."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file() or path.is_dir():
            fsync_path(path)
    fsync_path(folder)


def umask() -> int:
    """The process's umask, read without changing it (Linux reports it in /proc; elsewhere it is set and restored,
    which another thread creating a file at that instant could see)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_as_umask_allows(path: Path) -> None:
    """Give ``path`` (and everything under it, for a folder) the modes the umask gives new files and folders: 0666
    and 0777 less the umask. Only for what this process has just written (a staged checkpoint or export, a file)."""
    mask = umask()
    file_mode, folder_mode = 0o666 & ~mask, 0o777 & ~mask
    for item in [*path.rglob("*"), path] if path.is_dir() else [path]:
        if item.is_symlink():
            continue
        with contextlib.suppress(PermissionError):  # another user's file hard-linked in (``link_or_copy_tree``)
            item.chmod(folder_mode if item.is_dir() else file_mode)


def publish(source: Path, target: Path) -> None:
    """Rename ``source`` (a complete, flushed file or folder) to ``target``, durably, with the modes the user's umask
    gives (``share_as_umask_allows``)."""
    share_as_umask_allows(source)
    os.replace(source, target)
    fsync_path(target.parent)


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Replace ``path`` by what ``write(temporary_path)`` writes, in one step: readers see the old file or the
    complete new one, never a part of it. A failed write leaves the old file and no temporary."""
    temporary = path.with_name(f".{path.name}.partial")
    try:
        write(temporary)
        fsync_path(temporary)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk needs the space back
        raise
    publish(temporary, path)


def write_text_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def link_or_copy_tree(source: Path, target: Path) -> None:
    """``target`` as a copy of the folder ``source``, published in one step: each file hard-linked where the file
    system allows (no space, and the data stays when ``source`` is deleted), else copied."""
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted copy left
    for file in sorted(path for path in source.rglob("*") if path.is_file()):
        copy = staging / file.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(file, copy)
        except OSError:  # another file system, or one without hard links
            shutil.copy2(file, copy)
    fsync_tree(staging)
    publish(staging, target)
