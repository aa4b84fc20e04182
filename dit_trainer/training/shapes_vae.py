"""A warning at start when the VAE shipped with the package, the schema's default, is to encode other images than
the shapes it was trained on. It is a 0.66 M-parameter autoencoder trained on 32-px coloured circles, squares and
triangles: a photograph comes back from it as a blurred, discoloured likeness, and a DiT trained on its latents
learns no better. The default stays, since it is what lets the embedded demo run offline, but a real folder of
images should not meet it without a word."""

from __future__ import annotations

from pathlib import Path

from accelerate.logging import get_logger

from dit_trainer.config import DataConfig, VAEConfig
from dit_trainer.config.resolvers import asset_path
from dit_trainer.data import configured_sources

logger = get_logger(__name__)
SHAPES_SOURCES = ("shapes", "moving_shapes")  # the data it was trained on (moving_shapes: the same shapes, moving)


def uses_shapes_vae(vae: VAEConfig) -> bool:
    """Whether ``vae.pretrained`` is the shipped shapes VAE (by its resolved folder)."""
    pretrained = vae.pretrained
    if vae.kind != "autoencoder_kl" or not pretrained:
        return False
    return Path(pretrained).expanduser().resolve() == Path(asset_path("shapes_vae")).resolve()


def warn_shapes_vae_on_other_data(vae: VAEConfig, data: DataConfig) -> None:
    """Warn, on the main process, when data other than the shapes source is to be encoded by the shapes VAE."""
    sources = configured_sources(data)
    other = [name for name in sources if name not in SHAPES_SOURCES]
    if not other or not uses_shapes_vae(vae):
        return
    named = f"`data.mixture` names {other[0]}" if data.mixture else f"`data.source={other[0]}`"
    logger.warning(
        f"`vae.pretrained` is the VAE shipped for the shapes demo ({vae.pretrained}), trained only on 32-px "
        f"coloured shapes, and {named}, other images: it encodes them as a blurred, "
        "discoloured likeness, and the DiT can learn no better than what it decodes. For real images pick a VAE "
        "trained on them: `vae=sd` (Stable Diffusion's; hub access, or a local copy in `vae.pretrained`), your "
        "family's own (`vae=sd3`, `vae=flux`, `vae=sana`), or `vae=pixel` (no VAE: diffusion on the pixels).",
        main_process_only=True,
    )
