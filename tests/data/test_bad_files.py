"""Skipped files counted (``data/bad_files.py``): too many stop the run naming the setting that chose the data."""

import pytest
from accelerate import Accelerator

from dit_trainer.data.bad_files import BadFileCounter
from dit_trainer.errors import ConfigError

from ..conftest import one_paragraph


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
