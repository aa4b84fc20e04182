"""Shard fingerprints (``data/stream_changes.py``): a shard rewritten with the same name, byte size and
modification time but other images is told apart by its first bytes; each other kind of change is named."""

import os

from dit_trainer.data.stream_changes import HEAD_BYTES, shard_changes, shard_fingerprint

from .files import noise_png, write_shards


def _rewrite(path, seed: int) -> None:
    """``path`` written (again) with an image of the same size: its byte size and modification time are kept."""
    before = path.stat() if path.exists() else None
    write_shards(path.parent, [[{"__key__": "a", "png": noise_png(seed), "txt": "a"}]])
    if before is not None:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_size == before.st_size


def test_a_shard_fingerprint_tells_each_change_apart(tmp_path):
    shard = tmp_path / "000000.tar"
    _rewrite(shard, seed=0)
    saved = shard_fingerprint(str(shard))
    assert saved[1] == shard.stat().st_size > HEAD_BYTES / 8 and shard_changes([saved]) == []
    os.utime(shard, ns=(saved[2] + 10**9, saved[2] + 10**9))  # touched
    (touched,) = shard_changes([saved])
    assert touched.startswith("000000.tar (modified ") and " -> " in touched and "bytes" not in touched
    os.utime(shard, ns=(saved[2], saved[2]))
    _rewrite(shard, seed=1)  # other images: same name, size and time
    assert shard_changes([saved]) == ["000000.tar (other first bytes)"]
    shard.write_bytes(shard.read_bytes()[:1024])
    assert shard_changes([saved])[0].startswith(f"000000.tar ({saved[1]} -> 1024 bytes, modified")
    shard.unlink()
    assert shard_changes([saved]) == [f"{shard} cannot be read now"]
