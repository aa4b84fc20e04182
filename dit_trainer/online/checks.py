"""The checks every online method shares, of its section (a ``RolloutConfig``) and of what it needs of the rest: a
trained DiT to start from, prompts (class names or ids for a class-conditional model), updates that an epoch's
images can fill, and none of the settings that only data-set training has (DP-SGD, noise offset, validation
images, gradient accumulation); and the gold-reward watch's settings: a gold reward that is not trained on, held-out
prompts that are not trained on, a stop rule only with a gold reward to stop by."""

from __future__ import annotations

from dit_trainer.components.conditioners.class_labels import check_prompts_are_classes
from dit_trainer.config import (
    ConditionerConfig,
    DiffusionConfig,
    ModelConfig,
    PrivacyConfig,
    RewardConfig,
    TrainerConfig,
    ValidationConfig,
)
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.config.online import RolloutConfig
from dit_trainer.errors import require
from dit_trainer.hub import require_offline_copy
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards import REWARDS


def check_online(
    model: ModelConfig,
    privacy: PrivacyConfig,
    conditioner: ConditionerConfig,
    diffusion: DiffusionConfig,
    trainer: TrainerConfig,
    reward: RewardConfig,
    validation: ValidationConfig,
    method: str,
    rollouts: RolloutConfig,
) -> None:
    """``rollouts``: the section of ``trainer.method=method`` (the online method's, asked by its role)."""
    require(
        bool(trainer.init_from) or bool(model.pretrained),
        "trainer.init_from",
        trainer.init_from,
        f"`trainer.method={method}` fine-tunes a trained DiT, and neither a run to start from nor `model.pretrained` "
        "is set",
        "set `trainer.init_from=RUN_DIR` (a run train.py wrote) or `model.pretrained=<hub id or path>`",
    )
    prompts = load_prompts(rollouts.prompts, rollouts.prompt_file, f"{method}.")
    check_gold(conditioner, reward, method, rollouts, prompts)
    key = f"{method}.prompt_file" if rollouts.prompt_file else f"{method}.prompts"
    if conditioner.kind == CLASS_LABELS:  # first: what the model can be asked for at all
        check_prompts_are_classes(conditioner, key, prompts)
    trained_on = [name for name, weight in reward.weights.items() if weight]
    check_judged(trained_on, key, rollouts.prompt_file or prompts, prompts)
    images = rollouts.prompts_per_epoch * rollouts.group_size
    require(
        images >= rollouts.minibatches,
        f"{method}.minibatches",
        rollouts.minibatches,
        f"an epoch's {rollouts.prompts_per_epoch} x {rollouts.group_size} images per process cannot fill that many "
        "updates",
        f"set `{method}.minibatches={images}` or lower",
    )
    for key, value, unused in (
        ("diffusion.noise_offset", diffusion.noise_offset, "no data set's noise to offset"),
        ("validation.every_n_steps", validation.every_n_steps, "no data set to hold images out of"),
        ("privacy.enabled", privacy.enabled, "no data set whose examples DP-SGD would protect"),
    ):
        require(
            not value,
            key,
            value,
            f"`trainer.method={method}` trains on its own samples, with {unused}",
            f"set `{key}={'false' if isinstance(value, bool) else 0}`",
        )
    require(
        trainer.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        trainer.gradient_accumulation_steps,
        f"a `trainer.method={method}` update takes one minibatch of its images in one backward",
        f"set `trainer.gradient_accumulation_steps=1`; for less memory per update raise `{method}.minibatches`",
    )


def check_gold(
    conditioner: ConditionerConfig, reward: RewardConfig, method: str, rollouts: RolloutConfig, prompts: list[str]
) -> None:
    """The watch's settings: a gold reward that exists, is on this machine and is not one the run trains on; held-out
    prompts, none of them among the training ``prompts``; a stop margin or held-out prompts only with a gold reward."""
    gold = rollouts.gold_reward
    if not gold:
        for key, value in (("gold_stop_margin", rollouts.gold_stop_margin), ("gold_prompts", rollouts.gold_prompts),
                           ("gold_prompt_file", rollouts.gold_prompt_file)):  # fmt: skip
            require(
                not value,
                f"{method}.{key}",
                value,
                f"it belongs to the gold-reward watch, and `{method}.gold_reward` is not set: there is no gold reward "
                "to read (and the stop rule none to stop by)",
                f"name a reward the run does not train on, e.g. `{method}.gold_reward=shapes_alignment`, or remove "
                f"`{method}.{key}`",
            )
        return
    REWARDS.check(gold, f"{method}.gold_reward")
    require(
        not reward.weights.get(gold),
        f"{method}.gold_reward",
        gold,
        f"it is also a training reward (`reward.weights.{gold}`): a gold reward must be one the run is never "
        "trained on, or it rises with the training reward however the images are gamed",
        f"pick another reward as gold, or train without it (`reward.weights={{...}}` without `{gold}`)",
    )
    for key, name_or_path in REWARDS.get(gold, f"{method}.gold_reward").models(reward).items():
        if name_or_path:
            require_offline_copy(str(name_or_path), key)
    held_out = load_prompts(rollouts.gold_prompts, rollouts.gold_prompt_file, f"{method}.gold_")
    trained = sorted(set(held_out) & set(prompts))
    key = f"{method}.gold_prompt_file" if rollouts.gold_prompt_file else f"{method}.gold_prompts"
    require(
        not trained,
        key,
        rollouts.gold_prompt_file or held_out,
        f"{len(trained)} of its prompts are training prompts too ({', '.join(map(repr, trained[:3]))}"
        f"{', ...' if len(trained) > 3 else ''}): the gold reward must be read on prompts the run never trains on",
        f"hold those prompts out of `{method}.prompts` / `{method}.prompt_file`, or choose other gold prompts",
    )
    if conditioner.kind == CLASS_LABELS:
        check_prompts_are_classes(conditioner, key, held_out)
    check_judged([gold], key, rollouts.gold_prompt_file or held_out, held_out)


def check_judged(rewards: list[str], key: str, value: object, prompts: list[str]) -> None:
    """Each of ``rewards`` can score an image for every one of ``prompts`` (``key`` is ``value``): a judge of one
    data set's captions (the shapes judges) would fail, or score nothing, in the first rollout."""
    for name in rewards:
        entry = REWARDS.get(name, key)
        judges = getattr(entry, "judges", None)
        unjudged = [prompt for prompt in prompts if judges is not None and not judges(prompt)]
        require(
            not unjudged,
            key,
            value,
            f"the reward `{name}` cannot score an image for {len(unjudged)} of its prompts "
            f"({', '.join(map(repr, unjudged[:3]))}{', ...' if len(unjudged) > 3 else ''}): it reads only prompts "
            f"of the form {entry.judged_prompts}",
            "use prompts of that form, or a reward that reads them (`reward.weights`, `gold_reward`)",
        )
