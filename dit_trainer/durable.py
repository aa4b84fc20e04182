"""Durable writes: after a crash, a kill or a power loss, a file or folder is either the old one or the complete new
one, never a torn mix. Data reaches the disk (``fsync``) before the rename that publishes it, and the rename itself
is made durable by syncing the folder that holds it."""

from __future__ import annotations

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


def publish(source: Path, target: Path) -> None:
    """Rename ``source`` (a complete, flushed file or folder) to ``target``, durably."""
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
