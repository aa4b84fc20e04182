"""A GRPO run starts from a trained run (``grpo/init.py``): its config inherits the init run's and keeps the free
keys, and what it cannot start from is refused. (GRPO runs of train.py: tests/e2e/test_grpo.py.)"""

import json
from pathlib import Path

import pytest

from dit_trainer.errors import ConfigError, exit_code
from dit_trainer.run_folder import MANIFEST

from ..conftest import TINY_SHAPES, compose_config, grpo_overrides


@pytest.fixture()
def fake_init_run(tmp_path) -> Path:
    """A run folder as train.py leaves it, as far as ``grpo.init_from`` reads it: the TINY_SHAPES config and a
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
    assert cfg.model.pretrained == str((checkpoint / "transformer_ema").resolve()) == cfg.grpo.init_weights
    assert cfg.diffusion.sample_steps == 3 and cfg.optim.lr == 3e-5  # a sampling setting may differ
    assert cfg.grpo.enabled and cfg.trainer.max_steps == 4 and cfg.grpo.group_size == 4

    raw = _grpo_config(checkpoint, "grpo.init_ema=false")  # a checkpoint folder, its raw weights
    assert raw.model.pretrained == str((checkpoint / "transformer").resolve())
    assert raw.diffusion.sample_steps == 4


def test_grpo_config_refuses_what_it_cannot_start_from(fake_init_run, tmp_path):
    with pytest.raises(ConfigError, match=r"grpo\.init_from.*model\.num_layers=3 \(the init run has 2\)") as error:
        _grpo_config(fake_init_run, "model.num_layers=3")
    assert exit_code(error.value) == 2

    not_a_run = tmp_path / "not_a_run"
    not_a_run.mkdir()
    with pytest.raises(ConfigError, match=r"grpo\.init_from.*neither a run folder") as error:
        _grpo_config(not_a_run)
    assert str(not_a_run) in str(error.value) and exit_code(error.value) == 2

    with pytest.raises(ConfigError, match=r"grpo\.steps_per_trajectory.*only 3 trained steps.*=3` or lower"):
        _grpo_config(fake_init_run, "grpo.steps_per_trajectory=4")  # 4 sampler steps, the last deterministic

    from dit_trainer.assemble import save_resolved_config

    lora = compose_config([*TINY_SHAPES, f"model.pretrained={fake_init_run}", "lora.enabled=true"])
    save_resolved_config(lora, fake_init_run / "config.yaml")
    with pytest.raises(ConfigError, match=r"grpo\.init_from.*LoRA run.*scripts/export\.py"):
        _grpo_config(fake_init_run)
