import pytest
import torch
from PIL import Image

from dit_trainer.data.buckets import configured_buckets
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.data.source import Source, build_dataset
from dit_trainer.diffusion import OBJECTIVES
from dit_trainer.errors import ConfigError, ModelLoadError

from .conftest import CONFIG_DIR, EXPERIMENTS, compose_config, run_script


def test_the_expected_experiments_exist():
    assert {"dit", "shapes"} <= set(EXPERIMENTS)


@pytest.fixture()
def online(monkeypatch):
    """Validation checks hub ids only offline; these tests look at values, not at model availability."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment, tmp_path, online):
    if (
        experiment.startswith("dit_")
        and "family: dit" in (CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()
    ):
        for label in range(1000):  # class-conditional: class sub-folders (as many as ImageNet's)
            (tmp_path / f"class{label:04d}").mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / "class0000" / "a.png")
    else:
        (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    # A GRPO recipe fine-tunes a trained model: `grpo.init_from=RUN` (tests/test_grpo_runs.py) or model.pretrained.
    start = ["model.pretrained=PixArt-alpha/PixArt-XL-2-256x256"] if experiment.endswith("_grpo") else []
    cfg = compose_config([f"+experiment={experiment}", f"data.path={tmp_path}", *start])
    assert cfg.trainer.max_steps >= 1
    assert cfg.diffusion.objective in OBJECTIVES


def test_bucket_sizes_wait_for_the_config_files_of_models_not_on_this_machine(tmp_path, online, monkeypatch):
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    cfg = compose_config(["+experiment=dit", f"data.path={tmp_path}"])  # accepted: the VAE is only a hub id here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # so its config.json, downloaded when the data is read, cannot come
    with pytest.raises(ModelLoadError, match=r"`vae\.pretrained=stabilityai/sd-vae-ft-ema`"):
        configured_buckets(cfg)


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
    assert cfg.vae.pretrained == "stabilityai/sd-vae-ft-ema" and cfg.text_encoder.kind == "t5"
    assert cfg.trainer.mixed_precision == "bf16"


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["shapes", "dit_lora"])  # dit_lora: an experiment that inherits another
def test_cfg_job_prints_the_config(experiment):
    """Every experiment composes in-process (above); here Hydra's own command line prints two of them."""
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


@pytest.mark.slow
def test_cli_reports_a_bad_value_without_a_traceback_before_building_models():
    result = run_script(["train.py", "+experiment=shapes", "trainer.mixed_precision=fp8"], timeout=120)
    assert result.returncode == 2
    assert "trainer.mixed_precision" in result.stderr and "fp8" in result.stderr
    assert "auto, no, fp16, bf16" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Loading weights" not in result.stderr  # nothing was built


@pytest.mark.slow
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


def test_the_bare_config_is_the_schema_s_defaults():
    """`python train.py` with no overrides runs exactly `TrainConfig()`: the YAML groups it selects by default hold
    no values (interpolations such as `${asset:shapes_vae}` are compared unresolved, as both sides hold them)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dit_trainer.config import TrainConfig

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        composed = compose(config_name="train", overrides=[])
    bare = OmegaConf.to_container(composed, resolve=False)
    bare.pop("hydra", None)
    assert bare == OmegaConf.to_container(OmegaConf.structured(TrainConfig()), resolve=False)


def test_field_checks_pass_through_omegaconf_and_catch_a_merged_value():
    from omegaconf import OmegaConf

    from dit_trainer.config import TrainConfig, check_fields

    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(["trainer.batch_size=0"]))
    cfg = OmegaConf.to_object(merged)
    assert cfg.trainer.batch_size == 0 and cfg.trainer.max_steps == TrainConfig().trainer.max_steps
    with pytest.raises(ConfigError, match=r"`trainer.batch_size` is 0, but it must be >= 1.*`trainer.batch_size=1`"):
        check_fields(cfg)


@pytest.mark.parametrize(
    ("override", "key", "registry"),
    [("data.source=laion", "data.source", "dit_trainer.data:SOURCES"),
     ("vae.kind=vqgan", "vae.kind", "dit_trainer.components:VAE_KINDS"),
     ("text_encoder.kind=gemma", "text_encoder.kind", "dit_trainer.components:TEXT_ENCODER_KINDS"),
     ("diffusion.objective=x0", "diffusion.objective", "dit_trainer.diffusion:OBJECTIVES"),
     ("diffusion.sampler=heun", "diffusion.sampler", "dit_trainer.diffusion:SAMPLERS"),
     ("+reward.weights.aesthetic=1", "reward.weights.aesthetic", "dit_trainer.rewards:REWARDS")],
)  # fmt: skip
def test_an_unknown_name_is_refused_listing_its_registry(override, key, registry):
    import importlib

    module, name = registry.split(":")
    accepted = ", ".join(getattr(importlib.import_module(module), name))
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", override])
    assert f"`{key}`" in str(caught.value) and accepted in str(caught.value)


def test_builders_refuse_an_unknown_name_instead_of_falling_back():
    from dit_trainer.config import DataConfig, RewardConfig
    from dit_trainer.data.source import build_dataset
    from dit_trainer.rewards.build import build_reward

    with pytest.raises(ConfigError, match="`data.source` is 'laion'"):
        build_dataset(DataConfig(source="laion"))
    with pytest.raises(ConfigError, match="`reward.weights.aesthetic`"):
        build_reward(RewardConfig(weights={"aesthetic": 1.0}), torch.device("cpu"))


BUILT: list[str] = []
TINY_SOURCE = Source(lambda cfg: BUILT.append(cfg.path) or ShapesDataset(4, 32), "a folder", "/x")


def test_a_source_of_ones_own_is_named_by_its_import_path(tmp_path):
    """A data source outside the package is ``data.source=package.module:SOURCE``: validation and building both
    read it, and its own path rule applies."""
    with pytest.raises(ConfigError, match="`data=tests.test_config:TINY_SOURCE` needs a folder"):
        compose_config(["+experiment=shapes", "data.source=tests.test_config:TINY_SOURCE"])
    cfg = compose_config(["+experiment=shapes", "data.source=tests.test_config:TINY_SOURCE", f"data.path={tmp_path}"])
    assert len(build_dataset(cfg.data)) == 4 and [str(tmp_path)] == BUILT


def test_dit_lora_is_dit_with_lora(tmp_path, online):
    """experiment=dit_lora inherits experiment=dit: the recipe's prompts and logging come from one file."""
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    dit = compose_config(["+experiment=dit", f"data.path={tmp_path}"])
    lora = compose_config(["+experiment=dit_lora", f"data.path={tmp_path}"])
    assert lora.lora.enabled and not dit.lora.enabled
    assert lora.trainer.sample_prompts == dit.trainer.sample_prompts and lora.logger == dit.logger
    assert (lora.data.resolution, lora.trainer.batch_size, lora.trainer.max_steps) == (512, 8, 5000)


def test_a_python_built_config_resolves_its_interpolations():
    from dit_trainer.config import ASSETS_DIR, TrainConfig
    from dit_trainer.run_config import to_train_config

    cfg = to_train_config(TrainConfig())
    assert cfg.vae.pretrained == str(ASSETS_DIR / "shapes_vae")
    assert "${" not in cfg.text_encoder.pretrained
