"""What the models impose on image sizes: every side a multiple of the VAE's downsampling factor x the DiT's patch
size (x the family's packing), so that a latent cuts into whole patches. Read from the models' config files before
any weights load, so that the data (its buckets) and the checks know it before the models are built."""

from __future__ import annotations

from dit_trainer.components.dit import known_patch_size
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.vae import known_downsample_factor
from dit_trainer.config import DataConfig, ModelConfig, VAEConfig
from dit_trainer.data.buckets import BucketTable, bucket_table
from dit_trainer.errors import ConfigError
from dit_trainer.hub import model_config, pretrained_config


def check_resolution(model: ModelConfig, data: DataConfig, downsample_factor: int) -> None:
    """Refuse a ``data.resolution`` that the VAE's downsampling and the DiT's patches do not divide: the VAE would
    round the latent size, silently dropping the images' edges. Checked with the config when the factor is known
    then, else as soon as the VAE has loaded."""
    patch, resolution = known_patch_size(model), data.resolution
    step = downsample_factor * (patch or 1)
    if resolution % step == 0:
        return
    lower = resolution // step * step
    nearest = f"`data.resolution={lower}` or `data.resolution={lower + step}`" if lower else f"`data.resolution={step}`"
    divisor = f"the VAE's downsampling factor {downsample_factor}"
    if patch:
        divisor = f"the VAE's downsampling factor × the DiT's patch size = {downsample_factor} × {patch} = {step}"
    raise ConfigError(
        "data.resolution",
        resolution,
        f"it must be a multiple of {divisor} (images become {downsample_factor}× smaller latents, cut into patches; "
        "another size would be rounded, silently dropping the images' edges)",
        f"set {nearest}",
    )


def pixel_multiple(model: ModelConfig, vae: VAEConfig, download: bool = False) -> int | None:
    """What every image side must be a multiple of for its latent to cut into whole patches: the VAE's downsampling
    factor x the DiT's patch size. Read from the models' config.json files where they are on this machine; else
    None, or with ``download`` those files are downloaded (not the weights)."""
    factor, patch = known_downsample_factor(vae, download), known_patch_size(model)
    if download and patch is None:
        config = model_config(model.pretrained, model.subfolder, model.revision, "model.pretrained")
        patch = FAMILIES.get(model.family).latents_per_token(config)
    return None if factor is None or patch is None else factor * patch


def check_bucket_sizes(model: ModelConfig, vae: VAEConfig, data: DataConfig) -> None:
    """Listed ``data.buckets`` sizes that the latents would not cut into whole patches are refused with the config,
    where the models' config files are on this machine (else when the data is read: ``configured_buckets``), and
    so are image sides beyond a pretrained transformer's positions. Checked after the data's own checks, for a
    method that reads the data set."""
    if pixel_multiple(model, vae) is None:
        return
    table = configured_buckets(model, vae, data)
    sides = [data.resolution] if table is None else [side for size in table.sizes for side in size]
    key, value = ("data.buckets", data.buckets) if table is not None else ("data.resolution", data.resolution)
    check_largest_side(model, vae, max(sides), key, value)


def check_largest_side(model: ModelConfig, vae: VAEConfig, side: int, key: str, value: object) -> None:
    """Refuse images whose longest ``side`` (pixels, set by ``key`` = ``value``) a pretrained transformer of a family
    with a learned positional table has no positions for (SD3's ``pos_embed_max_size``): diffusers would fail in the
    first forward, after every model has loaded. Unchecked while the config files are not on this machine."""
    largest_latent_of = FAMILIES.get(model.family).largest_latent_of
    if largest_latent_of is None:
        return
    config = pretrained_config(model.pretrained, model.subfolder, model.revision)
    factor = known_downsample_factor(vae)
    if config is None or factor is None:
        return
    largest = largest_latent_of(config) * factor
    if side > largest:
        raise ConfigError(
            key,
            value,
            f"it asks for images {side} px on a side, and `model.pretrained` has positions for at most {largest} px "
            f"(its positional table: {largest // factor} latents x the VAE's factor {factor})",
            f"keep every side at {largest} px or less (a lower `data.resolution`, or fewer or squarer `data.buckets`)",
        )


def configured_buckets(model: ModelConfig, vae: VAEConfig, data: DataConfig) -> BucketTable | None:
    """The bucket table ``data.buckets`` asks for at ``data.resolution`` (None for squares); its sizes depend on
    the VAE and the patch size, whose config files are downloaded first if need be."""
    if data.buckets == "none":
        return None
    return bucket_table(data.buckets, data.resolution, pixel_multiple(model, vae, download=True))
