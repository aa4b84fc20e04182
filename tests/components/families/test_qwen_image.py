"""The Qwen-Image family (``components/families/qwen_image.py``), its conditioner (``conditioners/qwen_image.py``) and
VAE kind (``vae.kind=qwen_image``): the conditioner equal to ``QwenImagePipeline.encode_prompt``, the one-frame VAE
equal to the pipeline's use of it, ``predict`` as the pipeline calls the transformer, the published size counted on
the meta device, and the config rules refused with the key that breaks them."""

import pytest
import torch
from diffusers import QwenImagePipeline

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import build_dit
from dit_trainer.components.families.flux import pack
from dit_trainer.components.families.qwen_image import QWEN_IMAGE
from dit_trainer.components.meta import count_flops, meta_inputs
from dit_trainer.components.vae import build_vae, known_downsample_factor
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, ModelConfig, VAEConfig
from dit_trainer.errors import ConfigError

from ...conftest import TINY_SHAPES, components_of, compose_config
from ...tiny_qwen_image import MAX_LENGTH, TRANSFORMER, WIDTH, qwen_image_overrides, write_tiny_qwen_image

PROMPTS = ["a red circle", "A Blue square on the left", ""]


@pytest.fixture(scope="module")
def qwen_image_folder(tmp_path_factory):
    return write_tiny_qwen_image(tmp_path_factory.mktemp("qwen_image") / "Qwen-Image-tiny")


def test_conditioner_equals_the_pipeline_s_encode_prompt(qwen_image_folder):
    """The template's first 34 tokens dropped, each prompt's real tokens as the pipeline's (which pads to the longest
    with zeros), zeros and a masked-out tail to ``max_length``."""
    cfg = ConditionerConfig(pretrained=str(qwen_image_folder), kind="qwen_image", max_length=MAX_LENGTH)
    conditioner = build_text_encoder(cfg, torch.device("cpu"))
    assert conditioner.size == ConditionSize(WIDTH)
    pipe = QwenImagePipeline.from_pretrained(qwen_image_folder)
    with torch.no_grad():
        theirs, their_mask = pipe.encode_prompt(PROMPTS, device="cpu", max_sequence_length=MAX_LENGTH)
    condition = conditioner.encode(PROMPTS)
    assert condition.sequence.shape == (3, MAX_LENGTH, WIDTH) and condition.pooled is None
    length = theirs.shape[1]
    assert length < MAX_LENGTH and len(set(their_mask.sum(1).tolist())) == 3  # three lengths, all kept whole
    assert torch.equal(condition.mask[:, :length], their_mask) and not condition.mask[:, length:].any()
    torch.testing.assert_close(condition.sequence[:, :length], theirs, rtol=0, atol=1e-6)
    assert not condition.sequence[:, length:].any()


def test_the_one_frame_vae_encodes_and_decodes_as_the_pipeline_does(qwen_image_folder):
    """(B, 3, H, W) images through the video autoencoder as one-frame videos, normalised by its config's own
    per-channel statistics (QwenImagePipeline's ``(z - mean) / std``); the factor is known before it loads."""
    cfg = VAEConfig(kind="qwen_image", pretrained=str(qwen_image_folder), subfolder="vae")
    assert known_downsample_factor(cfg) == 2
    vae = build_vae(cfg, torch.device("cpu"))
    assert vae.latent_channels == 16 and vae.downsample_factor == 2 and vae.scaling_factor == 1.0
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    latents = vae.encode(images)
    raw = vae.autoencoder.encode(images[:, :, None]).latent_dist.mode()[:, :, 0]
    mean = torch.tensor(vae.autoencoder.config.latents_mean).view(1, -1, 1, 1)
    std = torch.tensor(vae.autoencoder.config.latents_std).view(1, -1, 1, 1)
    assert latents.shape == (2, 16, 8, 8)
    torch.testing.assert_close(latents, (raw - mean) / std)
    decoded = vae.autoencoder.decode((latents * std + mean)[:, :, None]).sample[:, :, 0]
    torch.testing.assert_close(vae.decode(latents), decoded.clamp(-1, 1))
    vae.drop_encoder()  # a cached run decodes without the encoder
    torch.testing.assert_close(vae.decode(latents), decoded.clamp(-1, 1))


def test_predict_calls_the_transformer_as_the_pipeline_does():
    """Packed latents, timestep / 1000, the packed grid as img_shapes; the caption's masked padding changes
    nothing."""
    dit = build_dit(ModelConfig(family="qwen_image", **TRANSFORMER), 16, 8, ConditionSize(WIDTH))
    generator = torch.Generator().manual_seed(0)
    x_t, t = torch.randn(2, 16, 8, 4, generator=generator), torch.tensor([250.0, 900.0])
    sequence = torch.randn(2, 12, WIDTH, generator=generator)
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5])
    with torch.no_grad():
        prediction = dit(x_t, t, Condition(sequence, mask))
        direct = dit.transformer(
            hidden_states=pack(x_t), timestep=t / 1000, encoder_hidden_states=sequence,
            encoder_hidden_states_mask=mask, img_shapes=[[(1, 4, 2)]] * 2, return_dict=False,
        )[0]  # fmt: skip
        second = dit(x_t[1:], t[1:], Condition(sequence[1:, :7], mask[1:, :7]))
    assert prediction.shape == x_t.shape
    torch.testing.assert_close(pack(prediction), direct, rtol=0, atol=0)
    torch.testing.assert_close(prediction[1:], second, rtol=0, atol=1e-5)


class Wrapper(torch.nn.Module):
    """Holds the DiT as ``module`` and calls it, as DistributedDataParallel does."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs):
        return self.module(*inputs)


def test_guidance_rescales_each_token_as_the_pipeline_does():
    """``guided_prediction`` with a Qwen-Image DiT (behind DDP's ``.module`` too) combines as QwenImagePipeline:
    each packed token's guided prediction rescaled to its conditional one's norm; other families keep the plain
    formula."""
    from dit_trainer.diffusion.sampler import guided_prediction

    dit = build_dit(ModelConfig(family="qwen_image", **TRANSFORMER), 16, 8, ConditionSize(WIDTH))
    generator = torch.Generator().manual_seed(1)
    x_t, t = torch.randn(1, 16, 8, 4, generator=generator), torch.tensor([600.0])
    condition = Condition.cat([Condition(torch.randn(1, 5, WIDTH, generator=generator), torch.ones(1, 5))] * 2)
    condition = Condition(condition.sequence * torch.tensor([1.0, 0.0])[:, None, None], condition.mask)
    with torch.no_grad():
        cond, uncond = pack(dit(torch.cat([x_t, x_t]), t.expand(2), condition).float()).chunk(2)
        comb = uncond + 4.0 * (cond - uncond)
        theirs = comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        ours = guided_prediction(dit, x_t, t, condition, 4.0)
        assert torch.equal(guided_prediction(Wrapper(dit), x_t, t, condition, 4.0), ours)
    torch.testing.assert_close(pack(ours), theirs, rtol=0, atol=1e-6)
    assert not torch.allclose(pack(ours), comb, atol=1e-3)  # the rescaling changed it
    pixart = build_dit(ModelConfig(family="pixart_alpha", num_layers=1, attention_head_dim=8, num_attention_heads=2,
                                   patch_size=2), 4, 8, ConditionSize(WIDTH))  # fmt: skip
    assert torch.equal(pixart.guide(cond, uncond, 4.0), comb)


def test_flops_are_counted_on_the_meta_device(qwen_image_folder):
    cfg = compose_config([*TINY_SHAPES, *qwen_image_overrides(qwen_image_folder)])
    parts = components_of(cfg)
    forward, training = count_flops(parts.dit, *meta_inputs(parts, 1))
    assert 0 < forward < training


@pytest.mark.slow  # about 14 s: full-size models on the meta device
def test_qwen_image_s_size_from_the_model_keys_is_the_class_s_published_configuration():
    """``model.*`` at Qwen-Image's sizes (24 heads x 128, 60 layers) with Qwen2.5-VL-7B's 3,584-wide features and the
    16-channel VAE build the class's default configuration, the released one: 20,430,401,088 parameters (the model
    card's "20B"), and 78.3 / 234.7 TFLOP forward / training per 1024-px image (4,096 image tokens) with a
    512-token caption, counted on the meta device."""
    from diffusers import QwenImageTransformer2DModel
    from torch.utils.flop_counter import FlopCounterMode

    from dit_trainer.components.dit import DiTAdapter

    published = ModelConfig(
        family="qwen_image", num_layers=60, num_attention_heads=24, attention_head_dim=128, patch_size=2
    )
    with torch.device("meta"):
        ours, released = QWEN_IMAGE.build(published, 16, 128, ConditionSize(3584)), QwenImageTransformer2DModel()
    assert {k: v for k, v in ours.config.items() if not k.startswith("_")} == {
        k: v for k, v in released.config.items() if not k.startswith("_")
    }
    parameters = sum(p.numel() for p in ours.parameters())
    print(f"Qwen-Image parameters: {parameters:,}")
    assert parameters == 20_430_401_088
    x_t, t = torch.zeros(1, 16, 128, 128, device="meta"), torch.full((1,), 500.0, device="meta")
    caption = Condition(torch.zeros(1, 512, 3584, device="meta"), torch.ones(1, 512, dtype=torch.long, device="meta"))
    with FlopCounterMode(display=False) as counted:
        forward = DiTAdapter(ours, QWEN_IMAGE)(x_t, t, caption)
    forward_flops = counted.get_total_flops()
    with FlopCounterMode(display=False) as counted:
        forward.sum().backward()
    print(f"Qwen-Image TFLOP forward {forward_flops / 1e12:.1f}, backward {counted.get_total_flops() / 1e12:.1f}")
    assert round(forward_flops / 1e12, 1) == 78.3
    assert round(counted.get_total_flops() / 1e12, 1) == 156.4  # the backward: about twice the forward


def test_a_loaded_transformer_that_does_not_fit_is_refused_before_its_weights_load(qwen_image_folder, monkeypatch):
    model = ModelConfig(family="qwen_image", pretrained=str(qwen_image_folder), subfolder="transformer")
    assert build_dit(model, 16, 8, ConditionSize(WIDTH)).transformer.config.joint_attention_dim == WIDTH
    with monkeypatch.context() as patched:  # refused from its config.json: the weights are never read
        patched.setattr("dit_trainer.components.dit.load_transformer", lambda cfg: pytest.fail("weights loaded"))
        with pytest.raises(ConfigError, match="expects 16-dim text features"):
            build_dit(model, 16, 8, ConditionSize(3584))
    with pytest.raises(ConfigError, match="input channels"):
        build_dit(model, 4, 8, ConditionSize(WIDTH))
    edit = dict(QWEN_IMAGE.build(ModelConfig(**TRANSFORMER), 16, 8, ConditionSize(WIDTH)).config, zero_cond_t=True)
    assert "Edit" in QWEN_IMAGE.mismatch(edit, 16, ConditionSize(WIDTH))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("conditioner.kind=t5", "conditioner.kind"),
        ("vae.kind=autoencoder_kl", "vae.kind"),
        ("diffusion.objective=v_prediction", "diffusion.objective"),
        ("model.patch_size=1", "model.patch_size"),
        ("model.learned_sigma=true", "model.learned_sigma"),
        ("privacy.enabled=true", "privacy.enabled"),
        ("+model.extra_config.joint_attention_dim=64", "model.extra_config.joint_attention_dim"),
        ("+model.extra_config.depth=3", "model.extra_config.depth"),  # no such argument
        ("+model.extra_config.zero_cond_t=true", "model.extra_config.zero_cond_t"),
        ("+model.extra_config.guidance_embeds=true", "model.extra_config.guidance_embeds"),
        ("+model.extra_config.axes_dims_rope=[4,4,4]", "model.extra_config.axes_dims_rope"),
        ("conditioner.max_length=1100", "conditioner.max_length"),
    ],
)
def test_config_rules_name_the_key(qwen_image_folder, override, key):
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, *qwen_image_overrides(qwen_image_folder), override])
    assert f"`{key}`" in str(error.value), str(error.value)


def test_a_transformer_folder_of_another_family_is_refused_with_the_config(qwen_image_folder):
    pretrained = [f"model.pretrained={qwen_image_folder}", "model.subfolder=transformer"]
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, *qwen_image_overrides(qwen_image_folder), *pretrained, "model.family=flux"])
    message = str(error.value)
    assert "`model.pretrained`" in message and "QwenImageTransformer2DModel" in message
    assert "`model.family=qwen_image`" in message and "\n" not in message
