import pytest

from dit_trainer.config import OBJECTIVES, ConfigError
from dit_trainer.hub import ModelLoadError

from .conftest import EXPERIMENTS, compose_config, run_script


def test_the_expected_experiments_exist():
    assert {"dit", "shapes"} <= set(EXPERIMENTS)


@pytest.fixture()
def online(monkeypatch):
    """Validation checks hub ids only offline; these tests look at values, not at model availability."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment, tmp_path, online):
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    cfg = compose_config([f"+experiment={experiment}", f"data.path={tmp_path}"])
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
    assert cfg.vae.pretrained == "stabilityai/sd-vae-ft-ema" and cfg.text_encoder.kind == "t5"
    assert cfg.trainer.mixed_precision == "bf16"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_cfg_job_prints_the_config(experiment):
    result = run_script(["train.py", f"+experiment={experiment}", "--cfg", "job"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "trainer:" in result.stdout and "max_steps:" in result.stdout


def test_offline_validation_names_a_model_missing_from_this_machine():
    with pytest.raises(ModelLoadError) as caught:
        compose_config(["+experiment=shapes", "vae=sd"])
    message = str(caught.value)
    assert "vae.pretrained=stabilityai/sd-vae-ft-ema" in message and "vae.pretrained=DIR" in message


def test_missing_data_path_names_the_folder(tmp_path):
    with pytest.raises(ConfigError, match="metadata.jsonl") as caught:
        compose_config(["+experiment=shapes", "data=imagefolder", f"data.path={tmp_path / 'nope'}"])
    assert "nope" in str(caught.value)


def test_cli_reports_a_bad_value_without_a_traceback_before_building_models():
    result = run_script(["train.py", "+experiment=shapes", "trainer.mixed_precision=fp8"], timeout=120)
    assert result.returncode == 2
    assert "trainer.mixed_precision" in result.stderr and "fp8" in result.stderr
    assert "auto, no, fp16, bf16" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Loading weights" not in result.stderr  # nothing was built


def test_cli_reports_a_type_error_naming_the_key():
    result = run_script(["train.py", "trainer.batch_size=many"], timeout=120)
    assert result.returncode != 0
    assert "batch_size" in result.stderr and "many" in result.stderr


def test_shapes_monitors_rewards_by_default_and_dit_does_not(tmp_path, online):
    shapes = compose_config(["+experiment=shapes"])
    assert shapes.monitor.grpo.enabled and shapes.reward.weights == {"shapes_alignment": 1.0}
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    dit = compose_config(["+experiment=dit", f"data.path={tmp_path}"])
    assert not dit.monitor.grpo.enabled and dit.reward.weights == {"clip_score": 1.0}
    assert dit.monitor.grpo.prompts == dit.trainer.sample_prompts


def test_choosing_a_reward_option_replaces_the_weights_rather_than_merging():
    cfg = compose_config(["+experiment=shapes", "reward=jpeg_compressibility"])
    assert cfg.reward.weights == {"jpeg_compressibility": 1.0}


def test_offline_validation_names_a_missing_clip_model_only_when_the_monitor_uses_it():
    with pytest.raises(ModelLoadError, match="reward.clip_model=openai/clip-vit-base-patch32"):
        compose_config(["+experiment=shapes", "reward=clip_score"])
    assert compose_config(["+experiment=shapes", "reward=clip_score", "monitor.grpo.enabled=false"])
