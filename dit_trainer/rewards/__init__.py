"""Judges of generated images. Rewards, behind one protocol: ``reward(images [0, 1] (B, 3, H, W), prompts) -> (B,)``
(a video run's: clips (B, 3, F, H, W))
(``base``), their weighted sum (``build``) and the statistics of a prompt's group of samples (``groups``); and the
distance of a set of samples from the run's validation images, FID and KID (``fid``: the FID monitor and
``evaluate.py`` share it, so it lives below both).

``REWARDS`` is the registry ``reward.weights`` names, each entry a ``base.Reward`` imported on first use: adding a
reward is its module, one entry here and one YAML file in ``configs/reward/`` (or, outside this package, a weight
for ``package.module:REWARD``).
"""

from dit_trainer.registry import Registry

REWARDS = Registry(
    "reward.weights",
    {
        "shapes_alignment": "dit_trainer.rewards.shapes:SHAPES_ALIGNMENT",
        "shapes_margin": "dit_trainer.rewards.shapes:SHAPES_MARGIN",
        "moving_shapes_alignment": "dit_trainer.rewards.shapes:MOVING_SHAPES_ALIGNMENT",
        "shapes_classifier": "dit_trainer.rewards.shape_classifier:SHAPES_CLASSIFIER",
        "clip_score": "dit_trainer.rewards.clip:CLIP_SCORE",
        "jpeg_compressibility": "dit_trainer.rewards.jpeg:JPEG_COMPRESSIBILITY",
        "digit_accuracy": "dit_trainer.rewards.digits:DIGIT_ACCURACY",
    },
    kind="dit_trainer.rewards.base:Reward",
)
