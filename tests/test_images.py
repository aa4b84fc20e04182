"""Sample grids: labels are whatever prompts users write, emoji and CJK included."""

import pytest
import torch
from PIL import ImageFont

from dit_trainer.images import image_grid

PROMPTS = ["一只红色的猫", "a 🐱 on a 🛋️", "café"]


@pytest.mark.parametrize("font", ["default", "bitmap"])
def test_grid_labels_in_any_script_are_drawn(monkeypatch, font):
    """PIL's default font is FreeType's when Pillow has FreeType; without it, a latin-1 bitmap font that cannot
    encode other characters: those become '?' rather than an error that ends the run at a sample grid."""
    if font == "bitmap":
        monkeypatch.setattr(ImageFont, "load_default", lambda size=None: ImageFont.load_default_imagefont())
    grid = image_grid(torch.rand(3, 3, 16, 16), columns=1, labels=PROMPTS, row_labels=PROMPTS)
    assert grid.size[1] == 3 * (64 + 12)
