"""The FLUX.2 [klein] family (``components/families/flux2.py``), its conditioner (``conditioners/flux2.py``) and VAE
kind (``vae.kind=flux2``): the conditioner and the patched VAE equal to ``Flux2KleinPipeline``'s, ``predict`` as the
pipeline calls the transformer, the published sizes counted on the meta device, and the config rules refused with
the key that breaks them."""

import pytest
import torch
from diffusers import Flux2KleinPipeline

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import build_dit
from dit_trainer.components.families.flux2 import FLUX2, positions
from dit_trainer.components.meta import count_flops, meta_inputs
from dit_trainer.components.vae import build_vae, known_downsample_factor
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, ModelConfig, VAEConfig
from dit_trainer.errors import ConfigError

from ...conftest import TINY_SHAPES, components_of, compose_config
from ...tiny_flux2 import EXTRA, MAX_LENGTH, TRANSFORMER, WIDTH, flux2_overrides, write_tiny_flux2

PROMPTS = ["a red circle", "A Blue square on the left", ""]


@pytest.fixture(scope="module")
def flux2_folder(tmp_path_factory):
    return write_tiny_flux2(tmp_path_factory.mktemp("flux2") / "FLUX.2-klein-tiny")


def test_conditioner_equals_the_pipeline_s_encode_prompt(flux2_folder):
    cfg = ConditionerConfig(pretrained=str(flux2_folder), kind="flux2", max_length=MAX_LENGTH)
    conditioner = build_text_encoder(cfg, torch.device("cpu"))
    assert conditioner.size == ConditionSize(3 * WIDTH)
    pipe = Flux2KleinPipeline.from_pretrained(flux2_folder)
    with torch.no_grad():
        theirs, _ = pipe.encode_prompt(PROMPTS, device="cpu", max_sequence_length=MAX_LENGTH)
    condition = conditioner.encode(PROMPTS)
    assert condition.sequence.shape == (3, MAX_LENGTH, 3 * WIDTH) and condition.pooled is None
    assert len(set(condition.mask.sum(1).tolist())) == 3  # three lengths, each padded to max_length
    torch.testing.assert_close(condition.sequence, theirs, rtol=0, atol=1e-6)


def test_the_patched_vae_encodes_and_decodes_as_the_pipeline_does(flux2_folder):
    """2 x 2 patches of the autoencoder's latents, normalised by its BatchNorm's running statistics
    (``Flux2KleinPipeline._encode_vae_image``); decoding undoes both (the pipeline's end of ``__call__``)."""
    cfg = VAEConfig(kind="flux2", pretrained=str(flux2_folder), subfolder="vae")
    assert known_downsample_factor(cfg) == 4  # the autoencoder's 2, then the patches'
    vae = build_vae(cfg, torch.device("cpu"))
    assert vae.latent_channels == 16 and vae.downsample_factor == 4
    pipe = Flux2KleinPipeline.from_pretrained(flux2_folder)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        theirs = pipe._encode_vae_image(images, None)
        latents = vae.encode(images)
        torch.testing.assert_close(latents, theirs, rtol=0, atol=1e-6)
        bn = pipe.vae.bn
        raw = latents * (bn.running_var + bn.eps).sqrt().view(1, -1, 1, 1) + bn.running_mean.view(1, -1, 1, 1)
        decoded = pipe.vae.decode(pipe._unpatchify_latents(raw)).sample
    torch.testing.assert_close(vae.decode(latents), decoded.clamp(-1, 1), rtol=0, atol=1e-5)
    in_bf16 = build_vae(cfg, torch.device("cpu"), torch.bfloat16)  # its statistics are not rounded to bf16
    assert in_bf16.dtype == torch.bfloat16
    assert torch.equal(in_bf16.latents_std, vae.latents_std) and torch.equal(in_bf16.latents_mean, vae.latents_mean)


def test_predict_calls_the_transformer_as_the_pipeline_does():
    """A token per latent position in row-major order, the pipeline's rotary ids, timestep / 1000, every text token
    attended to (the mask is not passed)."""
    dit = build_dit(ModelConfig(family="flux2", **TRANSFORMER, extra_config=EXTRA), 16, 4, ConditionSize(3 * WIDTH))
    generator = torch.Generator().manual_seed(0)
    x_t, t = torch.randn(2, 16, 4, 2, generator=generator), torch.tensor([250.0, 900.0])
    sequence = torch.randn(2, 6, 3 * WIDTH, generator=generator)
    with torch.no_grad():
        prediction = dit(x_t, t, Condition(sequence, torch.tensor([[1] * 6, [1] * 3 + [0] * 3])))
        latent_ids = Flux2KleinPipeline._prepare_latent_ids(x_t)
        text_ids = Flux2KleinPipeline._prepare_text_ids(sequence)
        tokens = dit.transformer(
            hidden_states=Flux2KleinPipeline._pack_latents(x_t), timestep=t / 1000, guidance=None,
            encoder_hidden_states=sequence, txt_ids=text_ids, img_ids=latent_ids, return_dict=False,
        )[0]  # fmt: skip
        direct = Flux2KleinPipeline._unpack_latents_with_ids(tokens, latent_ids, 4, 2)
    torch.testing.assert_close(prediction, direct, rtol=0, atol=0)
    image_ids, text = positions(4, 2, 6, torch.device("cpu"))
    assert torch.equal(image_ids, latent_ids[0]) and torch.equal(text, text_ids[0])


def test_flops_are_counted_on_the_meta_device(flux2_folder):
    cfg = compose_config([*TINY_SHAPES, *flux2_overrides(flux2_folder)])
    parts = components_of(cfg)
    forward, training = count_flops(parts.dit, *meta_inputs(parts, 1))
    assert 0 < forward < training


@pytest.mark.parametrize(
    ("name", "sizes", "text_width", "parameters", "tflop"),
    [
        ("klein 4B", {"num_layers": 5, "num_single_layers": 20, "num_attention_heads": 24}, 7680, 3_875_544_576, 34.8),
        ("klein 9B", {"num_layers": 8, "num_single_layers": 24, "num_attention_heads": 32}, 12288, 9_078_581_248, 75.5),
    ],
)
def test_klein_s_sizes_from_the_model_keys_count_as_published(name, sizes, text_width, parameters, tflop):
    """``model.*`` at FLUX.2 [klein]'s sizes (heads x 128, the blocks, Qwen3-4B's or -8B's three layers) build the
    released configuration: its parameters, and its forward TFLOP per 1024-px image (4,096 image tokens) with a
    512-token caption, counted on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    from dit_trainer.components.dit import DiTAdapter

    single = sizes.pop("num_single_layers")
    model = ModelConfig(family="flux2", attention_head_dim=128, patch_size=1, **sizes,
                        extra_config={"num_single_layers": single})  # fmt: skip
    with torch.device("meta"):
        ours = FLUX2.build(model, 128, 64, ConditionSize(text_width))
    counted_parameters = sum(p.numel() for p in ours.parameters())
    x_t, t = torch.zeros(1, 128, 64, 64, device="meta"), torch.full((1,), 500.0, device="meta")
    caption = Condition(torch.zeros(1, 512, text_width, device="meta"), torch.ones(1, 512, dtype=torch.long))
    with FlopCounterMode(display=False) as counted:
        DiTAdapter(ours, FLUX2)(x_t, t, caption.to(torch.device("meta")))
    print(f"FLUX.2 {name}: {counted_parameters:,} parameters, {counted.get_total_flops() / 1e12:.1f} TFLOP forward")
    assert counted_parameters == parameters and round(counted.get_total_flops() / 1e12, 1) == tflop


def test_a_loaded_transformer_that_does_not_fit_is_refused_before_its_weights_load(flux2_folder, monkeypatch):
    model = ModelConfig(family="flux2", pretrained=str(flux2_folder), subfolder="transformer")
    assert build_dit(model, 16, 4, ConditionSize(3 * WIDTH)).transformer.config.joint_attention_dim == 3 * WIDTH
    with monkeypatch.context() as patched:  # refused from its config.json: the weights are never read
        patched.setattr("dit_trainer.components.dit.load_transformer", lambda cfg: pytest.fail("weights loaded"))
        with pytest.raises(ConfigError, match="expects 24-dim text features"):
            build_dit(model, 16, 4, ConditionSize(7680))
    with pytest.raises(ConfigError, match="input channels"):
        build_dit(model, 32, 4, ConditionSize(3 * WIDTH))


def test_a_guidance_distilled_transformer_is_not_exported_to_the_klein_pipeline():
    """Flux2KleinPipeline passes no guidance strength, which such a transformer embeds in every prediction."""
    from dit_trainer.components.families.base import ExportParts

    extra = {**EXTRA, "guidance_embeds": True}
    dit = build_dit(ModelConfig(family="flux2", **TRANSFORMER, extra_config=extra), 16, 4, ConditionSize(3 * WIDTH))
    parts = ExportParts(None, None, None, None, None, dit.transformer, None, None, None, "Flux2KleinPipeline",
                        "float32", (16, 4, 4))  # fmt: skip
    with pytest.raises(ConfigError, match="without a guidance strength") as error:
        FLUX2.export(parts)
    assert "`model.extra_config.guidance_embeds`" in str(error.value)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("conditioner.kind=t5", "conditioner.kind"),
        ("vae.kind=autoencoder_kl", "vae.kind"),
        ("diffusion.objective=v_prediction", "diffusion.objective"),
        ("diffusion.resolution_shift_rule=linear", "diffusion.resolution_shift_rule"),  # FluxPipeline's, not ours
        ("model.patch_size=2", "model.patch_size"),
        ("model.learned_sigma=true", "model.learned_sigma"),
        ("privacy.enabled=true", "privacy.enabled"),
        ("+model.extra_config.joint_attention_dim=64", "model.extra_config.joint_attention_dim"),
        ("+model.extra_config.depth=3", "model.extra_config.depth"),  # no such argument
        ("+model.extra_config.axes_dims_rope=[4,4,4,2]", "model.extra_config.axes_dims_rope"),
        ("model.extra_config.num_single_layers=-1", "model.extra_config.num_single_layers"),
        ("conditioner.max_length=600", "conditioner.max_length"),
    ],
)
def test_config_rules_name_the_key(flux2_folder, override, key):
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, *flux2_overrides(flux2_folder), override])
    assert f"`{key}`" in str(error.value), str(error.value)


def test_a_conditioner_with_too_few_layers_is_refused(flux2_folder, tmp_path):
    from transformers import AutoConfig, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(flux2_folder, subfolder="text_encoder")
    config.num_hidden_layers, config.layer_types = 20, config.layer_types[:20]
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "text_encoder")
    cfg = ConditionerConfig(pretrained=str(flux2_folder), kind="flux2", subfolder=str(tmp_path / "text_encoder"))
    with pytest.raises(ConfigError, match="has 20 layers") as error:
        build_text_encoder(cfg, torch.device("cpu"))
    assert "`conditioner.pretrained`" in str(error.value)


def test_a_transformer_folder_of_another_family_is_refused_with_the_config(flux2_folder):
    pretrained = [f"model.pretrained={flux2_folder}", "model.subfolder=transformer"]
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, *flux2_overrides(flux2_folder), *pretrained, "model.family=flux"])
    message = str(error.value)
    assert "`model.pretrained`" in message and "Flux2Transformer2DModel" in message
    assert "`model.family=flux2`" in message and "\n" not in message
