"""What a saved stream position is valid for, and how a resume finds out that it no longer is.

A webdataset stream's position is a shard's place in a worker's shard list and a sample's place in that tar, so it
names other samples once the list or a shard's content changed since the checkpoint (rewritten shards often keep
their names and byte sizes: tar pads to 10 KiB records). The stream fingerprints each shard when it opens it (path,
size, modification time and a hash of its first 64 KiB: the first tar headers and image bytes, never the whole
shard) and saves those of the shards its position reads again; the loader compares them with the files in the main
process before its workers start (``StreamLoader.load_state_dict``). A change is refused in one paragraph, or with
``trainer.allow_config_change=true`` the stream starts its epoch again on the current data, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from dit_trainer.errors import ConfigError, shortlist

HEAD_BYTES = 64 * 1024
Fingerprint = list  # [path, size, mtime_ns, sha256 of the first HEAD_BYTES (16 hex digits)]: plain types


def shard_fingerprint(shard: str) -> Fingerprint:
    """``shard``'s fingerprint; size, time and hash are None when it cannot be read (the stream reports that where
    it reads it)."""
    try:
        stat = os.stat(shard)
        with open(shard, "rb") as file:
            head = hashlib.sha256(file.read(HEAD_BYTES)).hexdigest()[:16]
    except OSError:
        return [shard, None, None, None]
    return [shard, stat.st_size, stat.st_mtime_ns, head]


def list_key(shards: list[str]) -> str:
    """A short hash of a shard list, in order: what a worker's saved positions index into."""
    return hashlib.sha256(json.dumps(shards).encode()).hexdigest()[:16]


def _when(mtime_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns / 1e9))


def shard_changes(saved: list[Fingerprint]) -> list[str]:
    """How each shard of ``saved`` differs from its file now (nothing for an unchanged one)."""
    changes = []
    for fingerprint in saved:
        path, size, mtime, head = fingerprint
        now = shard_fingerprint(path)
        if now == list(fingerprint):
            continue
        _, size_now, mtime_now, head_now = now
        if size_now is None or size is None:
            changes.append(f"{path} {'cannot be read now' if size_now is None else 'could not be read then'}")
            continue
        differences = [
            f"{size} -> {size_now} bytes" if size_now != size else "",
            f"modified {_when(mtime)} -> {_when(mtime_now)}" if mtime_now != mtime else "",
            "other first bytes" if head_now != head else "",
        ]
        changes.append(f"{Path(path).name} ({', '.join(filter(None, differences))})")
    return changes


def refuse_unless_allowed(key: str, value: object, changes: list[str], allow_change: bool) -> None:
    """The one paragraph for a saved stream position that names other data now, unless the change is allowed."""
    if changes and not allow_change:
        raise ConfigError(
            key,
            value,
            "the checkpoint's stream position was saved on other data and would continue at samples it never named ("
            + shortlist(changes, 3, "; ")
            + ")",
            "resume with the data the run was trained on (a copy keeps modification times with `cp -p` or "
            "`rsync -t`), start a fresh run in a new `hydra.run.dir`, or add `trainer.allow_config_change=true` to "
            "start the stream's epoch again on the current data",
        )
