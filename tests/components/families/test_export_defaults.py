"""What the families' exports change so that a diffusers pipeline's default arguments fit the trained model, checked
on tiny transformers: PixArt's ``sample_size`` set to the trained latent size with the same positional table, and
DiT's label tables widened so that ``DiTPipeline``'s hard-coded null class (1000) is ours."""

import torch

from dit_trainer.components.families.dit import DIT_PIPELINE_CLASSES, with_pipeline_null_class
from dit_trainer.components.families.pixart import _at_trained_size


def test_a_pixart_transformer_moved_to_its_trained_size_predicts_as_before(tiny_transformer):
    """A transformer built for 8 x 8 latents and used at 4 x 4 (a pretrained model fine-tuned at half its size) gets
    sample_size 4, the pipelines' default size, and predicts exactly as before: the positional table is rescaled.
    Setting sample_size alone would move the table (the check that this test can fail)."""
    transformer = tiny_transformer(sample_size=8).transformer.eval()
    x, t = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([10, 700])
    text = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    kwargs = {"encoder_hidden_states": text, "timestep": t, "return_dict": False,
              "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}  # fmt: skip
    resized = _at_trained_size(transformer, 4)
    assert resized.config.sample_size == 4 and _at_trained_size(resized, 4) is resized
    with torch.no_grad():
        before, after = transformer(x, **kwargs)[0], resized(x, **kwargs)[0]
        naive = type(transformer).from_config({**transformer.config, "sample_size": 4})
        naive.load_state_dict(transformer.state_dict())
        moved = naive.eval()(x, **kwargs)[0]
    torch.testing.assert_close(after, before, atol=1e-6, rtol=0)
    assert (moved - before).abs().max() > 1e-3


def test_a_dit_exported_for_dit_pipeline_takes_id_1000_as_our_null_class(tiny_transformer):
    transformer = tiny_transformer("dit", num_layers=2, condition_dim=3).transformer.eval()  # 3 classes + null (3)
    widened = with_pipeline_null_class(transformer, 3)
    assert widened.config.num_embeds_ada_norm == DIT_PIPELINE_CLASSES
    x, t = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([500] * 4)
    with torch.no_grad():
        ours = transformer(x, timestep=t, class_labels=torch.tensor([0, 1, 2, 3]), return_dict=False)[0]
        theirs = widened(x, timestep=t, class_labels=torch.tensor([0, 1, 2, 1000]), return_dict=False)[0]
    torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=0)
    assert with_pipeline_null_class(widened, DIT_PIPELINE_CLASSES) is widened  # 1,000 classes: kept


def test_a_pipeline_that_guides_only_above_1_refuses_a_run_sampled_below_it(tiny_transformer):
    """Z-Image's, Qwen-Image's and FLUX.2's pipelines cannot guide with our scale below 1 (Z-Image's counts ours
    minus 1 and skips guidance under 0; the others guide only above 1): their exports refuse, naming the key."""
    import dataclasses

    import pytest

    from dit_trainer.components.families import FAMILIES
    from dit_trainer.components.families.base import ExportParts
    from dit_trainer.config import DiffusionConfig, TrainConfig
    from dit_trainer.errors import ConfigError

    cfg = TrainConfig()
    cfg = dataclasses.replace(cfg, diffusion=DiffusionConfig(objective="flow_matching", guidance_scale=0.5))
    for name in ("z_image", "qwen_image", "flux2"):
        family = FAMILIES.get(name)
        transformer = tiny_transformer(name, condition_dim=12).transformer
        parts = ExportParts(cfg.model, cfg.vae.kind, cfg.conditioner, cfg.data, cfg.diffusion, transformer, None, None,
                            None, family.pipeline, "float32", (16, 4, 4))  # fmt: skip
        with pytest.raises(ConfigError, match=f"{family.pipeline} guides only with a scale above our 1") as error:
            family.export(parts)
        assert "`diffusion.guidance_scale`" in str(error.value)
