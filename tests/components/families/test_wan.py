"""The Wan family (``components/families/wan.py``), its conditioner (``conditioners/wan.py``) and VAE kind
(``vae.kind=wan``): the conditioner equal to ``WanPipeline.encode_prompt``, the video VAE's clips and images,
``predict`` as the pipeline calls the transformer (an image a one-frame clip), the published sizes counted on the
meta device, the memory estimate of the 14B LoRA recipe, and the config rules refused with the key that breaks them."""

import pytest
import torch
from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
from torch import nn
from transformers import UMT5Config, UMT5EncoderModel

from dit_trainer.components.build import Components, latent_shape
from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import DiTAdapter, enable_gradient_checkpointing
from dit_trainer.components.families.wan import WAN
from dit_trainer.components.lora import apply_lora
from dit_trainer.components.vae import VideoVAE, build_vae, known_downsample_factor
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, LoRAConfig, ModelConfig, VAEConfig
from dit_trainer.config.resolvers import asset_path
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.errors import ConfigError
from dit_trainer.training.parallel.memory import GiB, check_fits, describe, estimate_memory

from ...conftest import TINY_SHAPES, compose_config
from ...tiny_wan import MAX_LENGTH, TRANSFORMER, WIDTH, wan_overrides, write_tiny_wan

PROMPTS = ["a red circle", "A  Blue square &amp; more", ""]
# Wan 2.1 T2V 14B as released (Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json); 1.3B: 12 heads, 30 layers,
# ffn 8960.
WAN_14B = {"num_layers": 40, "num_attention_heads": 40, "attention_head_dim": 128, "patch_size": 2}
UMT5_XXL = {"vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_heads": 64}


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    return write_tiny_wan(tmp_path_factory.mktemp("wan") / "Wan-tiny")


def test_conditioner_equals_the_pipeline_s_encode_prompt(wan_folder):
    """The prompt cleaned as the pipeline cleans it (HTML entities, whitespace), UMT5 (not T5: a table per layer),
    zero rows past each prompt's tokens."""
    cfg = ConditionerConfig(pretrained=str(wan_folder), kind="wan", max_length=MAX_LENGTH)
    conditioner = build_text_encoder(cfg, torch.device("cpu"))
    assert conditioner.size == ConditionSize(WIDTH) and type(conditioner.model).__name__ == "UMT5EncoderModel"
    pipe = WanPipeline.from_pretrained(wan_folder)
    with torch.no_grad():
        theirs, _ = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, max_sequence_length=MAX_LENGTH)
    condition = conditioner.encode(PROMPTS)
    assert condition.sequence.shape == (3, MAX_LENGTH, WIDTH) and condition.pooled is None
    torch.testing.assert_close(condition.sequence, theirs, rtol=0, atol=1e-6)
    lengths = condition.mask.sum(1)
    assert len(set(lengths.tolist())) == 3 and all(not row[n:].any() for row, n in zip(condition.sequence, lengths))


def test_the_video_vae_takes_clips_and_images(wan_folder):
    """A clip of 4k + 1 frames -> k + 1 latent frames (the first alone), normalised per channel over every frame
    (Wan's ``(z - mean) / std``); an image is a one-frame clip whose latents stay 4-D; decoding inverts both."""
    cfg = VAEConfig(kind="wan", pretrained=str(wan_folder), subfolder="vae")
    assert known_downsample_factor(cfg) == 8
    vae = build_vae(cfg, torch.device("cpu"))
    assert isinstance(vae, VideoVAE) and vae.temporal_factor == 4 and vae.latent_channels == 4
    assert latent_shape(13, vae, 4) == (4, 4, 4, 4) and latent_shape(1, vae, 4) == (4, 4, 4)
    clips = torch.rand(2, 3, 13, 32, 32) * 2 - 1
    latents = vae.encode(clips)
    assert latents.shape == (2, 4, 4, 4, 4)  # 4 latent frames of 4 channels: the shapes a 4-D view would confuse
    raw = vae.autoencoder.encode(clips).latent_dist.mode()
    mean = torch.tensor(vae.autoencoder.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.autoencoder.config.latents_std).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(latents, (raw - mean) / std)
    assert vae.decode(latents).shape == clips.shape
    image = clips[:, :, 0]
    assert vae.encode(image).shape == (2, 4, 4, 4)
    torch.testing.assert_close(vae.encode(image), latents[:, :, 0], rtol=0, atol=1e-5)  # causal: frame 0 alone
    assert vae.decode(vae.encode(image)).shape == image.shape


def test_an_image_vae_encodes_a_clip_frame_by_frame():
    """The shapes VAE (an image autoencoder) on a clip: each frame's latents, as many latent frames as frames."""
    vae = build_vae(VAEConfig(pretrained=asset_path("shapes_vae")), torch.device("cpu"))
    clips = torch.rand(2, 3, 3, 32, 32) * 2 - 1
    latents = vae.encode(clips)
    assert latents.shape == (2, 4, 3, 16, 16)
    for frame in range(3):
        torch.testing.assert_close(latents[:, :, frame], vae.encode(clips[:, :, frame]), rtol=0, atol=1e-6)
    assert vae.decode(latents).shape == clips.shape


def test_predict_is_the_pipeline_s_transformer_call_and_an_image_is_a_one_frame_clip():
    """The raw timestep (0-1000), the caption with no mask; the same weights on an image give the one-frame clip's
    prediction."""
    torch.manual_seed(0)
    model = ModelConfig(family="wan", **TRANSFORMER, extra_config={"ffn_dim": 32})
    transformer = WAN.build(model, 4, 4, ConditionSize(WIDTH)).eval()
    assert transformer.config.ffn_dim == 32 and list(transformer.config.patch_size) == [1, 2, 2]
    x_t, t = torch.randn(2, 4, 3, 4, 4), torch.tensor([999.0, 250.0])
    condition = Condition(torch.randn(2, 6, WIDTH), torch.ones(2, 6, dtype=torch.long))
    with torch.no_grad():
        ours = WAN.predict(transformer, x_t, t, condition)
        theirs = transformer(hidden_states=x_t, timestep=t, encoder_hidden_states=condition.sequence).sample
        image = WAN.predict(transformer, x_t[:, :, 0], t, condition)
        one_frame = transformer(x_t[:, :, :1], t, condition.sequence).sample[:, :, 0]
    assert torch.equal(ours, theirs) and torch.equal(image, one_frame)


def test_a_new_model_is_sized_by_the_config_with_a_temporal_patch_and_a_default_ffn():
    model = ModelConfig(family="wan", **TRANSFORMER, extra_config={"patch_size": [2, 2, 2]})
    transformer = WAN.build(model, 4, 4, ConditionSize(WIDTH))
    config = transformer.config
    assert list(config.patch_size) == [2, 2, 2] and config.ffn_dim == 4 * 2 * 12 and config.text_dim == WIDTH
    assert WAN.latents_per_token(config) == 2


def test_published_sizes_build_the_released_models_on_the_meta_device():
    """``model.*`` at the published sizes builds Wan 2.1's transformers: 1.3B (ffn 8960) and 14B (ffn 13824)."""
    counts = {}
    for name, sizes, ffn in (("1.3B", (30, 12), 8960), ("14B", (40, 40), 13824)):
        layers, heads = sizes
        model = ModelConfig(family="wan", num_layers=layers, num_attention_heads=heads, attention_head_dim=128,
                            patch_size=2, extra_config={"ffn_dim": ffn})  # fmt: skip
        with torch.device("meta"):
            ours = WAN.build(model, 16, 60, ConditionSize(4096))
            released = WanTransformer3DModel(num_attention_heads=heads, num_layers=layers, ffn_dim=ffn)
        counts[name] = sum(p.numel() for p in ours.parameters())
        assert counts[name] == sum(p.numel() for p in released.parameters())
    assert counts == {"1.3B": 1_418_996_800, "14B": 14_288_491_584}


class MetaUMT5(nn.Module):
    """UMT5-XXL's weights on the meta device, encoding any prompt as the 512 rows of zeros it pads to."""

    def __init__(self) -> None:
        super().__init__()
        self.model = UMT5EncoderModel(UMT5Config(**UMT5_XXL)).to(torch.bfloat16)

    def encode(self, prompts: list[str]) -> Condition:
        return Condition(torch.zeros(len(prompts), 512, 4096), torch.ones(len(prompts), 512, dtype=torch.long))


@pytest.mark.slow  # about 14 s: full-size models on the meta device
def test_the_14b_lora_recipe_s_memory_estimate_is_printed_and_refuses_a_batch_that_cannot_fit(online, tmp_path, capsys):
    """wan21_t2v_14b_lora's parts on the meta device (the released 14B with rank-32 adapters, UMT5-XXL and Wan's VAE in
    bf16, clips of 81 frames at 512 px: 16 x 21 x 64 x 64 latents, gradient checkpointing): one 80 GB GPU cannot
    hold even one clip (the float32 base and autocast's bf16 copy alone take 80 GiB), so it is refused; FSDP2 over 8
    GPUs fits one clip and refuses four."""
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.mp4", "text": "a clip"}\n')
    recipe = compose_config(["+experiment=wan21_t2v_14b_lora", f"data.path={tmp_path}"])
    assert (recipe.data.frames, recipe.data.resolution, recipe.lora.rank) == (81, 512, 32)
    model = ModelConfig(family="wan", **WAN_14B, extra_config={"ffn_dim": 13824})
    with torch.device("meta"):
        transformer = WAN.build(model, 16, 64, ConditionSize(4096))
        lora = LoRAConfig(enabled=True, rank=recipe.lora.rank, alpha=recipe.lora.alpha)
        apply_lora(transformer, lora, WAN.lora_targets)
        conditioner, vae = MetaUMT5(), AutoencoderKLWan().to(torch.bfloat16)
    dit = DiTAdapter(transformer, WAN)
    enable_gradient_checkpointing(dit)
    shape = (16, (recipe.data.frames - 1) // 4 + 1, recipe.data.resolution // 8, recipe.data.resolution // 8)
    parts = Components(vae, conditioner, dit, build_noise_schedule(recipe.diffusion), shape)
    one_gpu, sharded = (estimate_memory(parts, False, torch.bfloat16, shards=n) for n in (1, 8))
    for name, estimate in (("one GPU", one_gpu), ("FSDP2 x 8", sharded)):
        print(f"wan21_t2v_14b_lora, {name}: {describe(estimate)}; batch 1: {estimate.total(1, 1) / GiB:.1f} GiB")
    with pytest.raises(ConfigError, match="LoRA|FSDP"):
        check_fits(one_gpu, 1, 1, 80 * GiB)
    check_fits(sharded, 1, 1, 80 * GiB)
    with pytest.raises(ConfigError, match="trainer.batch_size"):
        check_fits(sharded, 4, 1, 80 * GiB)
    printed = capsys.readouterr().out
    assert "batch 1" in printed
    with capsys.disabled():
        print(printed, end="")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["privacy.enabled=true"], "privacy.enabled"),
        (["+model.extra_config.image_dim=1280"], "model.extra_config.image_dim"),
        (["+model.extra_config.patch_size=[1,4,4]"], "model.extra_config.patch_size"),
        (["model.attention_head_dim=13"], "model.attention_head_dim"),
        (["data.frames=4"], "data.frames"),  # Wan's VAE: 4k + 1 frames
        (["trainer.method=grpo"], "trainer.method"),  # the online methods read images
    ],
)
def test_config_rules_are_refused_with_the_key_that_breaks_them(wan_folder, overrides, key):
    with pytest.raises(ConfigError) as refused:
        compose_config([*TINY_SHAPES, *wan_overrides(wan_folder), *overrides])
    assert refused.value.key == key, refused.value


def test_a_released_wan_trains_with_flow_matching_and_a_new_one_may_take_another_objective(wan_folder):
    """The released weights predict the flow velocity; a new model is free (the embedded example's v-prediction)."""
    v_prediction = ["diffusion.scheduler=DDPMScheduler", "diffusion.objective=v_prediction",
                    "diffusion.timestep_sampling=uniform", "diffusion.sampler=ddim"]  # fmt: skip
    compose_config([*TINY_SHAPES, *wan_overrides(wan_folder), *v_prediction])
    with pytest.raises(ConfigError) as refused:
        pretrained = [f"model.pretrained={wan_folder}", "model.subfolder=transformer"]
        compose_config([*TINY_SHAPES, *wan_overrides(wan_folder), *v_prediction, *pretrained])
    assert refused.value.key == "diffusion.objective"


def test_an_image_family_cannot_take_clips():
    with pytest.raises(ConfigError) as refused:
        compose_config([*TINY_SHAPES, "data.source=moving_shapes", "data.frames=4"])
    assert refused.value.key == "data.frames" and "image family" in str(refused.value)


def test_an_image_source_cannot_give_clips():
    with pytest.raises(ConfigError) as refused:
        compose_config([*TINY_SHAPES, "model.family=wan", "diffusion=flow", "diffusion.objective=flow_matching",
                        "model.patch_size=2", "data.frames=3"])  # fmt: skip
    assert refused.value.key == "data.frames" and "data=shapes" in str(refused.value)
