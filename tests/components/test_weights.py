"""The run folder's own files are read back safely: weights as safetensors only, whatever else lies beside them."""

import pytest
import torch
from diffusers import PixArtTransformer2DModel

from dit_trainer.components.weights import load_weights
from dit_trainer.errors import ModelLoadError


def test_checkpoint_weights_are_never_read_from_a_pickle(tiny_pixart_dir, tmp_path):
    """A checkpoint's transformer folder that holds only a pickled .bin (not what dit-trainer writes) is not
    unpickled: loading refuses it and the model keeps its weights."""
    model = PixArtTransformer2DModel.from_pretrained(tiny_pixart_dir)
    pickled = tmp_path / "transformer"
    with torch.no_grad():
        changed = PixArtTransformer2DModel.from_pretrained(tiny_pixart_dir)
        changed.proj_out.weight.add_(1.0)
    changed.save_pretrained(pickled, safe_serialization=False)
    assert sorted(p.name for p in pickled.iterdir()) == ["config.json", "diffusion_pytorch_model.bin"]
    before = model.proj_out.weight.clone()
    with pytest.raises(ModelLoadError, match="Could not read the weights in .*safetensors"):
        load_weights(model, pickled, lora=False)
    assert torch.equal(model.proj_out.weight, before)
