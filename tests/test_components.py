import pytest
import torch
from diffusers import AutoencoderKL, PixArtTransformer2DModel
from transformers import BertModel, T5EncoderModel

from dit_trainer.components.dit import DiTAdapter, build_dit
from dit_trainer.components.text_encoder import build_text_encoder
from dit_trainer.components.vae import PixelVAE, build_vae
from dit_trainer.config import ASSETS_DIR, ModelConfig, TextEncoderConfig, VAEConfig
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.errors import ConfigError, ModelLoadError

CPU = torch.device("cpu")


def _shapes_images(count: int = 8) -> torch.Tensor:
    dataset = ShapesDataset(count, seed=1)
    return torch.stack([dataset[i]["image"] for i in range(count)])


def test_shipped_vae_encodes_normalised_latents_and_reconstructs():
    vae = build_vae(VAEConfig(pretrained=str(ASSETS_DIR / "shapes_vae")), CPU)
    assert not any(p.requires_grad for p in vae.parameters())
    images = _shapes_images(64)
    latents = vae.encode(images)
    assert latents.shape == (64, 4, 16, 16) and vae.downsample_factor == 2
    # per-channel statistics from the VAE's config make every channel roughly zero-mean, unit-variance
    assert latents.mean(dim=(0, 2, 3)).abs().max() < 0.2
    assert ((latents.std(dim=(0, 2, 3)) - 1).abs() < 0.2).all()
    assert torch.nn.functional.mse_loss(vae.decode(latents), images) < 0.01


def test_vae_uses_scaling_and_shift_factor_without_per_channel_statistics(tmp_path):
    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(32,), latent_channels=4, scaling_factor=0.5, shift_factor=0.25).save_pretrained(
        tmp_path / "vae"
    )
    vae = build_vae(VAEConfig(pretrained=str(tmp_path), subfolder="vae"), CPU)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    raw = vae.autoencoder.encode(images).latent_dist.mode()
    torch.testing.assert_close(vae.encode(images), (raw - 0.25) * 0.5)
    latents = vae.encode(images)
    torch.testing.assert_close(vae.decode(latents), vae.autoencoder.decode(raw).sample.clamp(-1, 1))


def test_pixel_vae_is_the_identity():
    vae = build_vae(VAEConfig(kind="pixel"), CPU)
    images = _shapes_images(2)
    assert isinstance(vae, PixelVAE) and vae.latent_channels == 3 and vae.downsample_factor == 1
    assert torch.equal(vae.encode(images), images) and torch.equal(vae.decode(images), images)


def test_missing_vae_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(ModelLoadError) as caught:
        build_vae(VAEConfig(pretrained=str(tmp_path / "missing_vae")), CPU)
    message = str(caught.value)
    assert "missing_vae" in message and "vae.pretrained" in message


def test_minilm_text_encoder_gives_fixed_length_hidden_states_and_mask(minilm_path):
    encoder = build_text_encoder(TextEncoderConfig(pretrained=minilm_path, max_length=8), CPU)
    assert isinstance(encoder.model, BertModel) and encoder.hidden_size == 384
    assert not any(p.requires_grad for p in encoder.parameters())
    embeds, mask = encoder.encode(["a red circle", ""])
    assert embeds.shape == (2, 8, 384) and mask.shape == (2, 8)
    assert mask[0].sum() > mask[1].sum() >= 1  # [CLS] a red circle [SEP] vs [CLS] [SEP]


def test_memoised_text_encoder_is_exact_and_bounded(minilm_path):
    cfg = TextEncoderConfig(pretrained=minilm_path, max_length=8)
    plain = build_text_encoder(cfg, CPU)
    cfg.memo_size = 2
    memo = build_text_encoder(cfg, CPU)
    prompts = ["a red circle", "a blue square", "a red circle", "a green triangle"]
    for a, b in zip(plain.encode(prompts), memo.encode(prompts)):
        torch.testing.assert_close(a, b)
    assert len(memo._memo) == 2


def test_t5_checkpoint_loads_encoder_only_from_subfolders(tiny_t5_dir):
    cfg = TextEncoderConfig(
        pretrained=str(tiny_t5_dir), subfolder="text_encoder", tokenizer_subfolder="tokenizer", max_length=12
    )
    encoder = build_text_encoder(cfg, CPU)
    assert isinstance(encoder.model, T5EncoderModel) and encoder.hidden_size == 32
    embeds, mask = encoder.encode(["a cat"])
    assert embeds.shape == (1, 12, 32) and mask.shape == (1, 12)


def test_dit_adapter_predicts_the_input_shape_and_hides_learned_sigma():
    cfg = ModelConfig(num_layers=1, num_attention_heads=2, attention_head_dim=8, patch_size=2, learned_sigma=True)
    dit = build_dit(cfg, in_channels=4, sample_size=8, condition_dim=16)
    assert dit.transformer.config.out_channels == 8 and dit.transformer.config.cross_attention_dim == 16
    x = torch.randn(3, 4, 8, 8)
    out = dit.predict(x, torch.tensor([1, 500, 999]), torch.randn(3, 5, 16), torch.ones(3, 5, dtype=torch.long))
    assert out.shape == x.shape


def test_dit_adapter_casts_inputs_to_the_weights_dtype():
    """float32 latents and embeddings into a bfloat16 DiT (inference after `.to(bfloat16)`) must not fail with a
    dtype mismatch in the patch embedding: the adapter casts them to the weights' dtype."""
    cfg = ModelConfig(num_layers=1, num_attention_heads=2, attention_head_dim=8, patch_size=2)
    dit = build_dit(cfg, in_channels=4, sample_size=8, condition_dim=16).to(torch.bfloat16)
    assert dit.compute_dtype == torch.bfloat16
    out = dit.predict(torch.randn(2, 4, 8, 8), torch.tensor([1, 999]), torch.randn(2, 5, 16), torch.ones(2, 5))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 8, 8)


def test_dit_sample_size_must_divide_by_patch():
    cfg = ModelConfig(num_layers=1, num_attention_heads=2, attention_head_dim=8, patch_size=3)
    with pytest.raises(ConfigError, match="patch"):
        build_dit(cfg, in_channels=4, sample_size=8, condition_dim=16)


def test_pretrained_pixart_with_micro_conditions_loads_and_runs(tmp_path):
    torch.manual_seed(0)
    PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=8,
        num_layers=1,
        cross_attention_dim=24,
        sample_size=8,
        patch_size=2,
        caption_channels=16,
        use_additional_conditions=True,
    ).save_pretrained(tmp_path / "transformer")
    dit = build_dit(ModelConfig(pretrained=str(tmp_path), subfolder="transformer"), 4, 8, 16)
    assert isinstance(dit, DiTAdapter) and dit.transformer.config.use_additional_conditions
    out = dit(torch.randn(2, 4, 8, 8), torch.tensor([10]), torch.randn(2, 3, 16), torch.ones(2, 3, dtype=torch.long))
    assert out.shape == (2, 4, 8, 8)
    with pytest.raises(ConfigError, match="text encoder"):
        build_dit(ModelConfig(pretrained=str(tmp_path), subfolder="transformer"), 4, 8, 384)
