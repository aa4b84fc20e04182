"""The shipped recipes (``configs/experiment``, ``configs/reward``): every experiment composes and validates, the
cluster recipes are what they say, and choosing a config option replaces rather than merges."""

import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from dit_trainer.data import SOURCES
from dit_trainer.diffusion import OBJECTIVES

from ..conftest import CONFIG_DIR, EXPERIMENTS, compose_config


def test_the_expected_experiments_exist():
    assert {"dit", "shapes"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment, tmp_path, online):
    if (
        experiment.startswith("dit_")
        and "family: dit" in (CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()
    ):
        Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
        for label in range(1000):  # class-conditional: class sub-folders with an image each (as many as ImageNet's)
            (tmp_path / f"class{label:04d}").mkdir()
            (tmp_path / f"class{label:04d}" / "a.png").hardlink_to(tmp_path / "a.png")
    else:
        (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    # An online recipe fine-tunes a trained model: `trainer.init_from=RUN` (tests/e2e/test_grpo.py) or
    # model.pretrained.
    online_recipe = experiment.endswith(("_grpo", "_nft", "_grpo_fast"))
    start = ["model.pretrained=PixArt-alpha/PixArt-XL-2-256x256"] if online_recipe else []
    if experiment.startswith("shapes_") and experiment.endswith("_nft"):
        start.append("diffusion.objective=v_prediction")  # the init run's (v or flow): the schema's epsilon is refused
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        source = compose(config_name="train", overrides=[f"+experiment={experiment}"]).data.source
    path = [f"data.path={tmp_path}"] if SOURCES.get(source).path_meaning else []  # the embedded data takes none
    cfg = compose_config([f"+experiment={experiment}", *path, *start])
    assert cfg.trainer.max_steps >= 1
    assert cfg.diffusion.objective in OBJECTIVES


def test_dit_experiment_is_the_cluster_recipe(tmp_path, online):
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    cfg = compose_config(["+experiment=dit", f"data.path={tmp_path}"])
    m = cfg.model
    assert (m.num_layers, m.num_attention_heads * m.attention_head_dim, m.num_attention_heads, m.patch_size) == (
        28,
        1152,
        16,
        2,
    )
    assert cfg.data.resolution == 256 and cfg.data.source == "imagefolder"
    assert cfg.data.buckets == "pixart" and (cfg.validation.every_n_steps, cfg.validation.split) == (5000, 0.01)
    assert cfg.vae.pretrained == "stabilityai/sd-vae-ft-ema" and cfg.conditioner.kind == "t5"
    assert cfg.trainer.mixed_precision == "bf16"


def test_shapes_monitors_rewards_by_default_and_dit_does_not(tmp_path, online):
    shapes = compose_config(["+experiment=shapes"])
    assert shapes.monitor.reward.enabled and shapes.reward.weights == {"shapes_alignment": 1.0}
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    dit = compose_config(["+experiment=dit", f"data.path={tmp_path}"])
    assert not dit.monitor.reward.enabled and dit.reward.weights == {"clip_score": 1.0}
    assert dit.monitor.reward.prompts == dit.trainer.sample_prompts


def test_choosing_a_reward_option_replaces_the_weights_rather_than_merging():
    cfg = compose_config(["+experiment=shapes", "reward=jpeg_compressibility"])
    assert cfg.reward.weights == {"jpeg_compressibility": 1.0}


def test_dit_lora_is_dit_with_lora(tmp_path, online):
    """experiment=dit_lora inherits experiment=dit: the recipe's prompts and logging come from one file."""
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    dit = compose_config(["+experiment=dit", f"data.path={tmp_path}"])
    lora = compose_config(["+experiment=dit_lora", f"data.path={tmp_path}"])
    assert lora.lora.enabled and not dit.lora.enabled
    assert lora.trainer.sample_prompts == dit.trainer.sample_prompts and lora.logger == dit.logger
    assert (lora.data.resolution, lora.trainer.batch_size, lora.trainer.max_steps) == (512, 8, 5000)


def test_sd35_nft_is_diffusion_nft_as_its_repository_sets_it(tmp_path, online):
    cfg = compose_config(["+experiment=sd35_nft", f"data.path={tmp_path}"])
    n = cfg.nft
    assert cfg.trainer.method == "nft" and cfg.model.family == "sd3" and cfg.diffusion.objective == "flow_matching"
    assert (cfg.lora.enabled, cfg.lora.rank, cfg.lora.alpha, cfg.optim.lr) == (True, 32, 64, 3e-4)
    assert (n.sample_steps, n.guidance_scale, n.group_size, n.beta, n.kl_weight) == (10, 1.0, 24, 1.0, 2e-5)
    assert (n.old_decay_rate, n.old_decay_max, n.minibatches) == (0.001, 0.5, 1) and cfg.diffusion.guidance_scale == 1
