"""Frozen autoencoders: images in [-1, 1] to latents ready for diffusion, and back."""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import (
    AutoencoderDC,
    AutoencoderKL,
    AutoencoderKLFlux2,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    ModelMixin,
)
from torch import nn

from dit_trainer.components import VAE_KINDS
from dit_trainer.components.freeze import freeze
from dit_trainer.components.kinds import VAEKind
from dit_trainer.config import VAEConfig
from dit_trainer.hub import load_pretrained, model_config, pretrained_config


def autoencoder_downsample_factor(config: dict) -> int | None:
    """An ``AutoencoderKL`` (``block_out_channels``) or ``AutoencoderDC`` (``encoder_block_out_channels``) halves
    the size in every encoder block but the last; a video autoencoder once per entry of its ``temperal_downsample``
    (Qwen-Image's, Wan 2.1's), unless its config states ``scale_factor_spatial`` (Wan 2.2's, whose 2 x 2 pixel patches
    double it); None for a config that lists none of them."""
    if config.get("scale_factor_spatial") is not None:
        return int(config["scale_factor_spatial"])
    if config.get("temperal_downsample") is not None:
        return 2 ** len(config["temperal_downsample"])
    blocks = config.get("encoder_block_out_channels") or config.get("block_out_channels")
    return 2 ** (len(blocks) - 1) if blocks else None


class FrozenVAE(nn.Module):
    """A diffusers autoencoder whose latents are normalised the way its config says: an ``AutoencoderKL`` (SD's
    4-channel one, SD3's and Flux's 16-channel ones with their ``shift_factor``), whose posterior training samples, or
    an ``AutoencoderDC`` (Sana's deep-compression autoencoder, 32x), whose latents are deterministic.

    With ``latents_mean``/``latents_std`` in the config (per-channel statistics, as SDXL-style VAEs and our
    shapes VAE carry) latents become ``(z - mean) * scaling_factor / std``; otherwise ``(z - shift) * scaling_factor``.
    A config without ``scaling_factor`` (Qwen-Image's: its statistics alone normalise) scales by 1.

    A clip (B, 3, F, H, W) goes through an image autoencoder frame by frame (``temporal_factor`` 1: as many latent
    frames as frames); ``VideoVAE`` compresses time too.
    """

    temporal_factor = 1

    def __init__(self, autoencoder: ModelMixin) -> None:
        super().__init__()
        self.autoencoder = freeze(autoencoder)
        config = autoencoder.config
        channels = config.get("latent_channels") or config["z_dim"]  # a video autoencoder's name for them
        self.scaling_factor = float(config.get("scaling_factor") or 1.0)
        shift = config.get("shift_factor") or 0.0
        mean = config.get("latents_mean") or [shift] * channels
        std = config.get("latents_std") or [1.0] * channels
        self.register_buffer("latents_mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("latents_std", torch.tensor(std, dtype=torch.float32))
        self.latent_channels = channels
        self.downsample_factor = autoencoder_downsample_factor(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.autoencoder.dtype

    def drop_encoder(self) -> None:
        """Free the encoder's memory when latents come from a cache: only the decoder is used (sample grids)."""
        self.autoencoder.encoder = None
        if hasattr(self.autoencoder, "quant_conv"):
            self.autoencoder.quant_conv = None

    def _stats(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-channel (mean, std) shaped to broadcast over ``latents``, an image's or a clip's."""
        shape = (1, -1) + (1,) * (latents.ndim - 2)
        return self.latents_mean.view(shape), self.latents_std.view(shape)

    @torch.no_grad()
    def encode_posterior(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, 3, H, W) or a clip's (B, 3, F, H, W) in [-1, 1] -> the raw posterior's (mean, std), float32: what a
        latent cache stores. A deterministic autoencoder's latent has no std (None): caches store half the bytes, and
        nothing is drawn."""
        if images.ndim == 5 and self.temporal_factor == 1:
            mean, std = self.encode_posterior(fold_frames(images))
            return unfold_frames(mean, len(images)), None if std is None else unfold_frames(std, len(images))
        encoded = self.autoencoder.encode(self._to_autoencoder(images.to(self.dtype)))
        if not hasattr(encoded, "latent_dist"):
            return self._from_autoencoder(encoded.latent, images.ndim).float(), None
        posterior = encoded.latent_dist
        return (
            self._from_autoencoder(posterior.mean, images.ndim).float(),
            self._from_autoencoder(posterior.std, images.ndim).float(),
        )

    def latents_from_posterior(
        self, mean: torch.Tensor, std: torch.Tensor | None, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Draw a latent from the posterior (its mode when ``generator`` is None or it has no std) and normalise
        it."""
        latents = (
            mean
            if generator is None or std is None
            else torch.addcmul(
                mean, std, torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            )
        )
        latents = self._patched(latents)
        mean, std = self._stats(latents)
        return (latents - mean) * self.scaling_factor / std

    @torch.no_grad()
    def encode(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> normalised latents (B, C, H/f, W/f), float32 (a clip's: (B, C, F', H/f, W/f)).

        With a ``generator`` the latent is sampled from the posterior, as training should; without, its mode.
        """
        return self.latents_from_posterior(*self.encode_posterior(images), generator)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents -> images (or clips) in [-1, 1] (float32)."""
        if latents.ndim == 5 and self.temporal_factor == 1:
            return unfold_frames(self.decode(fold_frames(latents)), len(latents))
        mean, std = self._stats(latents)
        latents = self._unpatched(latents.float() * std / self.scaling_factor + mean)
        decoded = self.autoencoder.decode(self._to_autoencoder(latents.to(self.dtype))).sample
        return self._from_autoencoder(decoded, latents.ndim).float().clamp(-1, 1)

    @staticmethod
    def _patched(latents: torch.Tensor) -> torch.Tensor:
        """The autoencoder's latents as the DiT's, before normalisation."""
        return latents

    @staticmethod
    def _unpatched(latents: torch.Tensor) -> torch.Tensor:
        """The DiT's latents, unnormalised, as the autoencoder's."""
        return latents

    @staticmethod
    def _to_autoencoder(images: torch.Tensor) -> torch.Tensor:
        """Our layout as the autoencoder takes it."""
        return images

    @staticmethod
    def _from_autoencoder(output: torch.Tensor, ndim: int) -> torch.Tensor:
        """The autoencoder's output in our layout of ``ndim`` dimensions."""
        return output


def fold_frames(clips: torch.Tensor) -> torch.Tensor:
    """(B, C, F, H, W) -> (B F, C, H, W): a clip's frames as a batch of images."""
    return clips.transpose(1, 2).flatten(0, 1)


def unfold_frames(images: torch.Tensor, batch: int) -> torch.Tensor:
    """``fold_frames`` undone for ``batch`` clips."""
    return images.unflatten(0, (batch, -1)).transpose(1, 2)


class VideoVAE(FrozenVAE):
    """A video autoencoder ((B, C, T, H, W), causal in time: Wan's ``AutoencoderKLWan``, Qwen-Image's
    ``AutoencoderKLQwenImage``): a clip of F frames becomes (F - 1) / ``temporal_factor`` + 1 latent frames (the first
    alone, then each group), and an image is a clip of one frame, as QwenImagePipeline and Wan's training on images
    use it (its latents stay (B, C, H, W))."""

    def __init__(self, autoencoder: ModelMixin) -> None:
        super().__init__(autoencoder)
        config = autoencoder.config
        self.temporal_factor = int(config.get("scale_factor_temporal") or 2 ** sum(config["temperal_downsample"]))

    def drop_encoder(self) -> None:
        """As ``FrozenVAE``'s, but the encoder becomes an empty module: the decoder's frame cache counts the encoder's
        convolutions too (none, now)."""
        self.autoencoder.encoder = nn.Module()
        self.autoencoder.quant_conv = None

    @staticmethod
    def _to_autoencoder(images: torch.Tensor) -> torch.Tensor:
        return images if images.ndim == 5 else images.unsqueeze(2)

    @staticmethod
    def _from_autoencoder(output: torch.Tensor, ndim: int) -> torch.Tensor:
        return output if ndim == 5 else output.squeeze(2)


class PixelVAE(nn.Module):
    """The identity "autoencoder": diffusion directly on pixels (``vae=pixel``)."""

    latent_channels = 3
    downsample_factor = 1
    temporal_factor = 1
    dtype = torch.float32

    def encode_posterior(self, images: torch.Tensor) -> tuple[torch.Tensor, None]:
        return images.float(), None

    def latents_from_posterior(
        self, mean: torch.Tensor, std: torch.Tensor | None, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return mean

    def encode(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return images.float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.float().clamp(-1, 1)

    def drop_encoder(self) -> None:
        """Nothing to free: the identity has no weights."""


class PatchedVAE(FrozenVAE):
    """FLUX.2's autoencoder (``AutoencoderKLFlux2``): its latents (32 channels at 1/8) cut into 2 x 2 patches (128
    channels at 1/16) and normalised by the running statistics of its BatchNorm, as FLUX.2's pipelines do; the DiT
    learns on those, one token a patched latent."""

    def __init__(self, autoencoder: AutoencoderKLFlux2) -> None:
        super().__init__(autoencoder)
        bn = autoencoder.bn
        self.latents_mean = bn.running_mean.detach().float()
        self.latents_std = (bn.running_var.detach().float() + bn.eps).sqrt()
        self.latent_channels *= 4
        self.downsample_factor *= 2

    @staticmethod
    def _patched(latents: torch.Tensor) -> torch.Tensor:
        b, c, h, w = latents.shape
        patches = latents.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
        return patches.reshape(b, c * 4, h // 2, w // 2)

    @staticmethod
    def _unpatched(latents: torch.Tensor) -> torch.Tensor:
        b, c, h, w = latents.shape
        patches = latents.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
        return patches.reshape(b, c // 4, h * 2, w * 2)


def frozen_autoencoder(
    autoencoder_class: type[ModelMixin], frozen: type[FrozenVAE] = FrozenVAE
) -> Callable[..., FrozenVAE]:
    """A kind's ``build(cfg, device, dtype)``: its autoencoder class loaded from ``vae.pretrained``, frozen (by
    ``frozen``: the wrapper that feeds it its input's layout)."""

    def build(cfg: VAEConfig, device: torch.device, dtype: torch.dtype) -> FrozenVAE:
        autoencoder = load_pretrained(
            autoencoder_class.from_pretrained,
            cfg.pretrained,
            "vae.pretrained",
            subfolder=cfg.subfolder,
            revision=cfg.revision,
            torch_dtype=dtype,
        )
        return frozen(autoencoder).to(device)

    return build


def _autoencoder_factor(cfg: VAEConfig, download: bool) -> int | None:
    """From the autoencoder's config.json when it is on this machine (or, with ``download``, once that file alone is
    downloaded); None when only loading it will tell."""
    if download:
        config = model_config(cfg.pretrained, cfg.subfolder, cfg.revision, "vae.pretrained")
    else:
        config = pretrained_config(cfg.pretrained, cfg.subfolder, cfg.revision) or {}
    return autoencoder_downsample_factor(config)


AUTOENCODER_KL = VAEKind(frozen_autoencoder(AutoencoderKL), _autoencoder_factor)
AUTOENCODER_DC = VAEKind(frozen_autoencoder(AutoencoderDC), _autoencoder_factor)
QWEN_IMAGE = VAEKind(frozen_autoencoder(AutoencoderKLQwenImage, VideoVAE), _autoencoder_factor, temporal_factor=4)
WAN = VAEKind(frozen_autoencoder(AutoencoderKLWan, VideoVAE), _autoencoder_factor, temporal_factor=4)


def _patched_vae(cfg: VAEConfig, device: torch.device, dtype: torch.dtype) -> PatchedVAE:
    """FLUX.2's autoencoder, loaded in float32 and then cast to ``dtype``: its BatchNorm statistics are buffers that
    loading in bf16 would round (the variance by up to 0.4 %), and ``PatchedVAE`` keeps them exact."""
    vae = frozen_autoencoder(AutoencoderKLFlux2, PatchedVAE)(cfg, device, torch.float32)
    vae.autoencoder.to(dtype)
    return vae


FLUX2 = VAEKind(
    _patched_vae, lambda cfg, download: None if (factor := _autoencoder_factor(cfg, download)) is None else 2 * factor
)
PIXEL = VAEKind(
    lambda cfg, device, dtype: PixelVAE(), lambda cfg, download: PixelVAE.downsample_factor, pretrained=False
)


def known_downsample_factor(cfg: VAEConfig, download: bool = False) -> int | None:
    """The downsampling factor before any model loads (1 in pixel space); None when only loading will tell (a hub
    id not downloaded yet), unless ``download`` fetches the autoencoder's config file first."""
    return VAE_KINDS.get(cfg.kind).downsample_factor(cfg, download)


def build_vae(cfg: VAEConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> FrozenVAE | PixelVAE:
    """The configured VAE, frozen, on ``device`` in ``dtype`` (its normalisation statistics stay float32)."""
    return VAE_KINDS.get(cfg.kind).build(cfg, device, dtype)
