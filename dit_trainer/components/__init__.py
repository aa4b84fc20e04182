"""The frozen VAE, the frozen conditioner (a text encoder, or class labels) and the trainable DiT, each behind one
call signature, and ``build.build_components``, which builds them (and the noise schedule) from a run's config.

The kinds a config names are registries, imported on first use (``dit_trainer.registry``): ``vae.kind`` here,
``conditioner.kind`` here, ``model.family`` in ``families``. Each entry checks what it needs of the config.
"""

from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.registry import Registry

VAE_KINDS = Registry(
    "vae.kind",
    {
        "autoencoder_kl": "dit_trainer.components.vae:AUTOENCODER_KL",
        "autoencoder_dc": "dit_trainer.components.vae:AUTOENCODER_DC",
        "qwen_image": "dit_trainer.components.vae:QWEN_IMAGE",
        "wan": "dit_trainer.components.vae:WAN",
        "flux2": "dit_trainer.components.vae:FLUX2",
        "pixel": "dit_trainer.components.vae:PIXEL",
    },
    kind="dit_trainer.components.kinds:VAEKind",
)
# auto reads the checkpoint's model type; T5 and CLIP checkpoints hold more than their text encoder, so t5 and clip
# load their encoder-only classes; class_labels conditions a class-conditional family on class ids; sd3, flux, sana,
# z_image, qwen_image, flux2 and wan are those families' own encoders, read from the subfolders of one pipeline folder
# (`conditioner.pretrained`).
CONDITIONER_KINDS = Registry(
    "conditioner.kind",
    {
        "auto": "dit_trainer.components.conditioners.text_encoder:TRANSFORMERS_ENCODER",
        "t5": "dit_trainer.components.conditioners.text_encoder:TRANSFORMERS_ENCODER",
        "clip": "dit_trainer.components.conditioners.text_encoder:TRANSFORMERS_ENCODER",
        CLASS_LABELS: "dit_trainer.components.conditioners.class_labels:CLASS_LABELS_ENCODER",
        "sd3": "dit_trainer.components.conditioners.sd3:SD3_ENCODERS",
        "flux": "dit_trainer.components.conditioners.flux:FLUX_ENCODERS",
        "sana": "dit_trainer.components.conditioners.sana:SANA_ENCODER",
        "z_image": "dit_trainer.components.conditioners.z_image:Z_IMAGE_ENCODER",
        "qwen_image": "dit_trainer.components.conditioners.qwen_image:QWEN_IMAGE_ENCODER",
        "flux2": "dit_trainer.components.conditioners.flux2:FLUX2_ENCODER",
        "wan": "dit_trainer.components.conditioners.wan:WAN_ENCODER",
    },
    kind="dit_trainer.components.kinds:ConditionerKind",
)
