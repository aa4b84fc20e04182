"""The Flux family (``components/families/flux.py``) and its conditioner (``conditioners/flux.py``): packing and
position ids as FluxPipeline's, the conditioner equal to ``FluxPipeline.encode_prompt``, the embedded guidance
reaching the transformer, and the config rules refused with the key that breaks them."""

import pytest
import torch
from diffusers import FluxPipeline

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import build_dit
from dit_trainer.components.families.flux import FLUX, image_ids, pack, rope_axes, unpack
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, ModelConfig
from dit_trainer.errors import ConfigError

from ...conftest import TINY_SHAPES, compose_config
from ...tiny_flux import CLIP_WIDTH, EXTRA, T5_LENGTH, T5_WIDTH, TRANSFORMER, flux_overrides, write_tiny_flux

PROMPTS = ["a red circle", "A Blue square", ""]


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    return write_tiny_flux(tmp_path_factory.mktemp("flux") / "FLUX.1-tiny")


def test_packing_and_position_ids_are_flux_pipeline_s():
    latents = torch.randn(2, 16, 6, 4)
    packed = pack(latents)
    torch.testing.assert_close(packed, FluxPipeline._pack_latents(latents, 2, 16, 6, 4), rtol=0, atol=0)
    assert torch.equal(unpack(packed, 6, 4), latents)
    expected = FluxPipeline._prepare_latent_image_ids(2, 3, 2, "cpu", torch.float32)
    assert torch.equal(image_ids(6, 4, "cpu", torch.float32), expected)
    with pytest.raises(ValueError, match="odd side"):
        pack(torch.randn(1, 16, 5, 4))
    assert rope_axes(128) == (16, 56, 56) and sum(rope_axes(8)) == 8 and all(a % 2 == 0 for a in rope_axes(24))


def test_conditioner_equals_the_pipeline_s_encode_prompt(flux_folder):
    cfg = ConditionerConfig(pretrained=str(flux_folder), kind="flux", max_length=T5_LENGTH, memo_size=8)
    conditioner = build_text_encoder(cfg, torch.device("cpu"))
    assert conditioner.size == ConditionSize(T5_WIDTH, CLIP_WIDTH)
    pipe = FluxPipeline.from_pretrained(flux_folder)
    with torch.no_grad():
        embeds, pooled, _ = pipe.encode_prompt(PROMPTS, max_sequence_length=T5_LENGTH)
    condition = conditioner.encode(PROMPTS)
    assert condition.sequence.shape == (3, T5_LENGTH, T5_WIDTH) and condition.pooled.shape == (3, CLIP_WIDTH)
    assert torch.equal(condition.sequence, embeds) and torch.equal(condition.pooled, pooled)
    assert condition.mask[2].tolist() == [1] + [0] * (T5_LENGTH - 1)  # "" is T5's end-of-sequence token only
    assert torch.equal(conditioner.encode(PROMPTS[::-1]).pooled, pooled.flip(0))  # memoised rows, same values


def test_embedded_guidance_reaches_the_transformer_and_comes_from_the_config():
    model = ModelConfig(family="flux", **TRANSFORMER, extra_config=EXTRA, embedded_guidance=2.0)
    dit = build_dit(model, 16, 8, ConditionSize(T5_WIDTH, CLIP_WIDTH))
    assert dit.transformer.config.in_channels == 64 and dit.transformer.embedded_guidance == 2.0
    generator = torch.Generator().manual_seed(0)
    x_t = torch.randn(2, 16, 8, 4, generator=generator)  # not square: rows and columns must not swap
    condition = Condition(
        torch.randn(2, 5, T5_WIDTH, generator=generator),
        torch.ones(2, 5, dtype=torch.long),
        torch.randn(2, CLIP_WIDTH, generator=generator),
    )
    with torch.no_grad():
        out = dit(x_t, torch.tensor([500.0]), condition)
        dit.transformer.embedded_guidance = 5.0
        other = dit(x_t, torch.tensor([500.0]), condition)
        direct = dit.transformer(
            hidden_states=pack(x_t), timestep=torch.full((2,), 0.5), guidance=torch.full((2,), 5.0),
            pooled_projections=condition.pooled, encoder_hidden_states=condition.sequence,
            txt_ids=torch.zeros(5, 3), img_ids=image_ids(8, 4, "cpu", torch.float32), return_dict=False,
        )[0]  # fmt: skip
    assert out.shape == x_t.shape and (out - other).abs().max() > 1e-4
    torch.testing.assert_close(other, unpack(direct, 8, 4), rtol=0, atol=0)


def test_a_loaded_transformer_that_does_not_fit_is_refused(flux_folder):
    model = ModelConfig(family="flux", pretrained=str(flux_folder), subfolder="transformer")
    assert build_dit(model, 16, 8, ConditionSize(T5_WIDTH, CLIP_WIDTH)).transformer.config.guidance_embeds
    with pytest.raises(ConfigError, match="pooled text vector"):
        build_dit(model, 16, 8, ConditionSize(T5_WIDTH, None))
    with pytest.raises(ConfigError, match="input channels"):
        build_dit(model, 4, 8, ConditionSize(T5_WIDTH, CLIP_WIDTH))
    assert FLUX.mismatch(dict(FLUX.build(ModelConfig(**TRANSFORMER), 16, 8, ConditionSize(12, 7)).config), 16,
                         ConditionSize(12, 7)) is None  # fmt: skip


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("conditioner.kind=auto", "conditioner.pooling"),  # MiniLM without a pooled vector
        ("diffusion.objective=v_prediction", "diffusion.objective"),
        ("model.patch_size=4", "model.patch_size"),
        ("+model.extra_config.num_layers=3", "model.extra_config.num_layers"),
        ("+model.extra_config.axes_dims_rope=[2,2,2]", "model.extra_config.axes_dims_rope"),
        ("diffusion.shift=3.0", "diffusion.shift"),  # resolution_shift replaces it
        ("conditioner.max_length=600", "conditioner.max_length"),
    ],
)
def test_config_rules_name_the_key(flux_folder, override, key):
    overrides = [*TINY_SHAPES, *flux_overrides(flux_folder), override]
    if override.startswith("conditioner.kind"):
        overrides = [o for o in overrides if not o.startswith("conditioner.pretrained")]
    with pytest.raises(ConfigError) as error:
        compose_config(overrides)
    assert f"`{key}`" in str(error.value), str(error.value)


def test_a_pretrained_flux_needs_even_latent_sides_though_its_config_says_patch_size_1(flux_folder):
    """FluxTransformer2DModel's patch_size is 1; the family packs 2 x 2 latents, so bucket and image sides are
    multiples of 4 px with the tiny VAE's factor 2, and 18 px (9 latents) is refused."""
    from dit_trainer.components.geometry import pixel_multiple

    pretrained = [f"model.pretrained={flux_folder}", "model.subfolder=transformer"]
    cfg = compose_config([*TINY_SHAPES, *flux_overrides(flux_folder), *pretrained])
    assert pixel_multiple(cfg.model, cfg.vae) == 4
    with pytest.raises(ConfigError, match="multiple of 4") as error:
        compose_config([*TINY_SHAPES, *flux_overrides(flux_folder), *pretrained, "data.resolution=18"])
    assert "`data.resolution`" in str(error.value)


def test_a_mean_pooled_minilm_is_a_valid_flux_conditioner(flux_folder):
    overrides = [o for o in flux_overrides(flux_folder) if not o.startswith("conditioner.")]
    cfg = compose_config([*TINY_SHAPES, *overrides, "conditioner.pooling=mean"])
    assert cfg.model.family == "flux" and cfg.conditioner.kind == "auto"
