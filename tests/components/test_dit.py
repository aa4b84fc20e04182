"""The trainable DiT behind one call (``components/dit.py``): predictions shaped like the input with a learned
variance hidden, inputs cast to the weights' dtype, and a latent size the patches must divide."""

import pytest
import torch

from dit_trainer.condition import Condition
from dit_trainer.errors import ConfigError


def test_dit_adapter_predicts_the_input_shape_and_hides_learned_sigma(tiny_transformer):
    dit = tiny_transformer(num_layers=1, learned_sigma=True)
    assert dit.transformer.config.out_channels == 8 and dit.transformer.config.cross_attention_dim == 16
    x = torch.randn(3, 4, 8, 8)
    out = dit.predict(
        x, torch.tensor([1, 500, 999]), Condition(torch.randn(3, 5, 16), torch.ones(3, 5, dtype=torch.long))
    )
    assert out.shape == x.shape


def test_dit_adapter_casts_inputs_to_the_weights_dtype(tiny_transformer):
    """float32 latents and embeddings into a bfloat16 DiT (inference after `.to(bfloat16)`) must not fail with a
    dtype mismatch in the patch embedding: the adapter casts them to the weights' dtype."""
    dit = tiny_transformer(num_layers=1).to(torch.bfloat16)
    assert dit.compute_dtype == torch.bfloat16
    out = dit.predict(
        torch.randn(2, 4, 8, 8), torch.tensor([1, 999]), Condition(torch.randn(2, 5, 16), torch.ones(2, 5))
    )
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 8, 8)


@pytest.mark.parametrize("learned_sigma", [False, True])
def test_dit_adapter_prediction_is_no_view_of_the_transformer_output(tiny_transformer, learned_sigma):
    """FSDP2 hooks the root's output for its backward and warns of a view, on which an in-place op would drop that
    hook; PixArt's prediction is a channel slice of the output, with or without a learned variance."""
    dit = tiny_transformer(num_layers=1, learned_sigma=learned_sigma)
    x = torch.randn(2, 4, 8, 8)
    with torch.enable_grad():
        out = dit(x, torch.tensor([1, 999]), Condition(torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.long)))
    assert out._base is None and out.requires_grad and out.shape == x.shape


def test_dit_sample_size_must_divide_by_patch(tiny_transformer):
    with pytest.raises(ConfigError, match="patch"):
        tiny_transformer(num_layers=1, patch_size=3)


def test_sizes_set_beside_a_pretrained_model_that_it_does_not_have_are_named_in_a_warning(
    tiny_transformer, tmp_path, caplog
):
    """`model.pretrained` brings its own architecture: `model.num_layers=12` beside it is not used, and the user
    who meant to cut the model is told so; sizes the model has, and the defaults, are not named."""
    from dit_trainer.components.dit import build_dit
    from dit_trainer.condition import ConditionSize
    from dit_trainer.config import ModelConfig

    tiny_transformer(num_layers=2, patch_size=2).transformer.save_pretrained(tmp_path / "pretrained")
    pretrained = str(tmp_path / "pretrained")

    def loaded(**fields) -> tuple[int, str]:
        caplog.clear()
        dit = build_dit(ModelConfig(pretrained=pretrained, **fields), 4, 8, ConditionSize(16))
        return dit.transformer.config.num_layers, caplog.text

    layers, warned = loaded(num_layers=12, patch_size=2, extra_config={"norm_eps": 0.5})
    assert layers == 2
    assert "`model.num_layers=12` (it has 2)" in warned and "`model.extra_config.norm_eps=0.5`" in warned
    assert "model.patch_size" not in warned and "model.attention_head_dim" not in warned
    assert loaded(num_layers=2, patch_size=2, attention_head_dim=8) == (2, "")  # what the tiny model has
    assert loaded() == (2, "")  # the defaults
