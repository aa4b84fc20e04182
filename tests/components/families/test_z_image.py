"""The Z-Image family (``components/families/z_image.py``) and its conditioner (``conditioners/z_image.py``): the
conditioner equal to ``ZImagePipeline.encode_prompt``, ``predict`` as the pipeline calls the transformer (per-image
lists, each caption's real tokens, reversed time, negated output), FLOPs counted on the meta device, and the config
rules refused with the key that breaks them."""

import pytest
import torch
from diffusers import ZImagePipeline

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import build_dit
from dit_trainer.components.families.z_image import Z_IMAGE, rope_axes
from dit_trainer.components.meta import count_flops, meta_inputs
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, ModelConfig
from dit_trainer.errors import ConfigError

from ...conftest import TINY_SHAPES, components_of, compose_config
from ...tiny_z_image import EXTRA, MAX_LENGTH, TRANSFORMER, WIDTH, write_tiny_z_image, z_image_overrides

PROMPTS = ["a red circle", "A Blue square on the left", ""]


@pytest.fixture(scope="module")
def z_image_folder(tmp_path_factory):
    return write_tiny_z_image(tmp_path_factory.mktemp("z_image") / "Z-Image-tiny")


def test_conditioner_equals_the_pipeline_s_encode_prompt(z_image_folder):
    cfg = ConditionerConfig(pretrained=str(z_image_folder), kind="z_image", max_length=MAX_LENGTH, memo_size=8)
    conditioner = build_text_encoder(cfg, torch.device("cpu"))
    assert conditioner.size == ConditionSize(WIDTH)
    pipe = ZImagePipeline.from_pretrained(z_image_folder)
    with torch.no_grad():
        theirs = pipe._encode_prompt(list(PROMPTS), max_sequence_length=MAX_LENGTH)
    condition = conditioner.encode(PROMPTS)
    assert condition.sequence.shape == (3, MAX_LENGTH, WIDTH) and condition.pooled is None
    ours = [row[mask.bool()] for row, mask in zip(condition.sequence, condition.mask)]
    assert [len(row) for row in ours] == [len(row) for row in theirs] and len({len(row) for row in ours}) == 3
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_predict_calls_the_transformer_as_the_pipeline_does():
    """Per-image latents and unpadded captions, time 1 - sigma, the output negated; a caption's padding changes
    nothing (it is dropped), and a batch equals its images alone."""
    dit = build_dit(ModelConfig(family="z_image", **TRANSFORMER, extra_config=EXTRA), 16, 8, ConditionSize(WIDTH))
    generator = torch.Generator().manual_seed(0)
    x_t, t = torch.randn(2, 16, 8, 4, generator=generator), torch.tensor([250.0, 900.0])
    sequence = torch.randn(2, 12, WIDTH, generator=generator)
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5])
    with torch.no_grad():
        prediction = dit(x_t, t, Condition(sequence, mask))
        direct = dit.transformer([x_t[0, :, None], x_t[1, :, None]], (1000 - t) / 1000, [sequence[0], sequence[1, :7]])
        assert torch.equal(prediction, -torch.stack(direct[0]).squeeze(2))
        second = dit(x_t[1:], t[1:], Condition(sequence[1:, :7], mask[1:, :7]))
    torch.testing.assert_close(prediction[1:], second, rtol=0, atol=1e-5)
    assert rope_axes(128) == (32, 48, 48) and rope_axes(16) == (4, 6, 6) and rope_axes(8) == (4, 2, 2)


def test_flops_are_counted_on_the_meta_device(z_image_folder):
    """The memory estimate and the FLOP count run the model on meta tensors, where a mask's values are unknown:
    every caption token counts."""
    cfg = compose_config([*TINY_SHAPES, *z_image_overrides(z_image_folder)])
    parts = components_of(cfg)
    forward, training = count_flops(parts.dit, *meta_inputs(parts, 1))
    assert 0 < forward < training


def test_a_loaded_transformer_that_does_not_fit_is_refused_before_its_weights_load(z_image_folder, monkeypatch):
    model = ModelConfig(family="z_image", pretrained=str(z_image_folder), subfolder="transformer")
    assert build_dit(model, 16, 8, ConditionSize(WIDTH)).transformer.config.cap_feat_dim == WIDTH
    with monkeypatch.context() as patched:  # refused from its config.json: the weights are never read
        patched.setattr("dit_trainer.components.dit.load_transformer", lambda cfg: pytest.fail("weights loaded"))
        with pytest.raises(ConfigError, match="expects 16-dim text features"):
            build_dit(model, 16, 8, ConditionSize(384))
    with pytest.raises(ConfigError, match="input channels"):
        build_dit(model, 4, 8, ConditionSize(WIDTH))
    omni = dict(Z_IMAGE.build(ModelConfig(**TRANSFORMER), 16, 8, ConditionSize(WIDTH)).config, siglip_feat_dim=8)
    assert "Omni" in Z_IMAGE.mismatch(omni, 16, ConditionSize(WIDTH))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("conditioner.pooling=mean", "conditioner.pooling"),
        ("conditioner.kind=sd3", "conditioner.kind"),  # a pooled vector Z-Image would drop
        ("diffusion.objective=v_prediction", "diffusion.objective"),
        ("model.patch_size=4", "model.patch_size"),
        ("model.learned_sigma=true", "model.learned_sigma"),
        ("privacy.enabled=true", "privacy.enabled"),
        ("+model.extra_config.dim=64", "model.extra_config.dim"),
        ("+model.extra_config.depth=3", "model.extra_config.depth"),  # no such argument
        ("+model.extra_config.siglip_feat_dim=8", "model.extra_config.siglip_feat_dim"),
        ("+model.extra_config.axes_dims=[4,4,4]", "model.extra_config.axes_dims"),
        ("model.extra_config.n_refiner_layers=0", "model.extra_config.n_refiner_layers"),
        ("conditioner.max_length=600", "conditioner.max_length"),
    ],
)
def test_config_rules_name_the_key(z_image_folder, override, key):
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, *z_image_overrides(z_image_folder), override])
    assert f"`{key}`" in str(error.value), str(error.value)


def test_a_tokenizer_without_a_chat_template_is_refused(z_image_folder, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(z_image_folder, subfolder="tokenizer")
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    cfg = ConditionerConfig(
        pretrained=str(z_image_folder), kind="z_image", tokenizer_subfolder=str(tmp_path / "tokenizer")
    )
    with pytest.raises(ConfigError, match="no chat template") as error:
        build_text_encoder(cfg, torch.device("cpu"))
    assert "`conditioner.pretrained`" in str(error.value)


def test_a_transformer_folder_of_another_family_is_refused_with_the_config(z_image_folder):
    pretrained = [f"model.pretrained={z_image_folder}", "model.subfolder=transformer"]
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, *z_image_overrides(z_image_folder), *pretrained, "model.family=sana"])
    message = str(error.value)
    assert "`model.pretrained`" in message and "ZImageTransformer2DModel" in message
    assert "`model.family=z_image`" in message and "\n" not in message


def test_z_image_turbo_s_size_from_the_model_keys_is_the_class_s_published_configuration():
    """``model.*`` at Z-Image-Turbo's sizes (30 heads x 128, 30 layers, 2 refiner blocks a stream) and Qwen3-4B's
    2,560-wide features build the class's default configuration, the released one: 6,154,908,736 parameters (the
    model card's "6B"), and 62.5 / 187.5 TFLOP forward / training per 1024-px image (4,096 image tokens) with a
    512-token caption, counted on the meta device."""
    from diffusers import ZImageTransformer2DModel
    from torch.utils.flop_counter import FlopCounterMode

    from dit_trainer.components.dit import DiTAdapter

    published = ModelConfig(
        family="z_image", num_layers=30, num_attention_heads=30, attention_head_dim=128, patch_size=2
    )
    with torch.device("meta"):
        ours, released = Z_IMAGE.build(published, 16, 128, ConditionSize(2560)), ZImageTransformer2DModel()
    assert {k: v for k, v in ours.config.items() if not k.startswith("_")} == {
        k: v for k, v in released.config.items() if not k.startswith("_")
    }
    assert sum(p.numel() for p in ours.parameters()) == 6_154_908_736
    x_t, t = torch.zeros(1, 16, 128, 128, device="meta"), torch.full((1,), 500.0, device="meta")
    caption = Condition(torch.zeros(1, 512, 2560, device="meta"), torch.ones(1, 512, dtype=torch.long, device="meta"))
    with FlopCounterMode(display=False) as counted:
        forward = DiTAdapter(ours, Z_IMAGE)(x_t, t, caption)
    assert round(counted.get_total_flops() / 1e12, 1) == 62.5
    with FlopCounterMode(display=False) as counted:
        forward.sum().backward()
    assert round(counted.get_total_flops() / 1e12, 1) == 125.0  # the backward: twice the forward


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_at_a_fixed_shift_the_export_hands_the_pipeline_our_sampler_s_noise_levels(shift):
    """ZImagePipeline spaces its sigmas as linspace(1, 1/N, N) and shifts what it is given; the export's ``sigmas``
    (unshifted) make it step through the levels our Euler sampler does (z_image.yaml samples at shift 3)."""
    from diffusers.pipelines.z_image.pipeline_z_image import retrieve_timesteps

    from dit_trainer.components.families.base import fixed_shift_sigmas
    from dit_trainer.diffusion.flow import ResolutionShift, euler_scheduler

    ours = euler_scheduler(1000, shift, None)
    ours.set_timesteps(8)
    pipeline = euler_scheduler(1000, shift, None)
    retrieve_timesteps(pipeline, 8, "cpu", sigmas=fixed_shift_sigmas(pipeline, 8), mu=0.5)  # as __call__ does
    torch.testing.assert_close(pipeline.sigmas, ours.sigmas, rtol=0, atol=1e-6)
    assert fixed_shift_sigmas(euler_scheduler(1000, 1.0, ResolutionShift()), 8) is None  # its spacing is ours
