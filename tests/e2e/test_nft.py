"""DiffusionNFT (``trainer.method=nft``, ``+experiment=shapes_nft``) run end to end as a user runs it: from a
finished tiny run, it rolls out, scores and trains the DiT (full weights or LoRA adapters), checkpoints its old
policy and prompt statistics, and a resumed run logs exactly what the uninterrupted one did. What it cannot train is
refused with the config, before any model loads."""

from pathlib import Path

import pytest
from safetensors.torch import load_file

from dit_trainer.assemble import build_trainer
from dit_trainer.errors import ConfigError
from dit_trainer.training.preflight import PREFLIGHT_ROWS

from ..conftest import (
    TINY_SHAPES,
    compose_config,
    nft_overrides,
    read_metrics,
    rows_trained_in_a_step,
    run_here,
    train_here,
)

pytestmark = pytest.mark.slow  # train.py runs

WEIGHTS = "diffusion_pytorch_model.safetensors"


def train_nft(init_dir: Path, run_dir: Path, *extra: str, epochs: int = 4) -> None:
    result = run_here(["train.py", f"hydra.run.dir={run_dir}", *nft_overrides(init_dir, *extra, epochs=epochs)])
    assert result.returncode == 0, result.stderr[-4000:]


def timeless(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if "per_sec" not in k and "seconds" not in k} for r in records]


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> Path:
    """A finished tiny shapes run (2 layers, 10 steps, EMA weights in its checkpoint)."""
    run_dir = tmp_path_factory.mktemp("nft_init") / "run"
    train_here(run_dir, "trainer.max_steps=10", "trainer.checkpoint_every=10", "trainer.sample_every=0")
    return run_dir


def test_an_nft_run_trains_checkpoints_its_old_policy_and_resumes_exactly(init_run, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train_nft(init_run, whole)
    metrics = read_metrics(whole)
    assert [record["step"] for record in metrics] == [1, 2, 3, 4]
    assert all(0 < record["nft/optimality_mean"] < 1 and record["grad_norm"] > 0 for record in metrics)
    assert [record["nft/old_decay"] for record in metrics] == pytest.approx([0.001, 0.002, 0.003, 0.004])
    checkpoint = whole / "checkpoints" / "checkpoint-2"
    assert (checkpoint / "nft_prompts.json").is_file()
    old_policy = load_file(checkpoint / "nft_old_policy.safetensors")
    trained = load_file(checkpoint / "transformer" / WEIGHTS)
    assert len(old_policy) == len(trained)  # one old tensor per trained one (full fine-tuning)
    start = load_file(init_run / "checkpoints" / "checkpoint-10" / "transformer_ema" / WEIGHTS)
    assert any(not start[name].equal(trained[name]) for name in start)

    train_nft(init_run, cut, epochs=2)
    train_nft(init_run, cut, "trainer.resume=latest")
    assert timeless(read_metrics(cut)) == timeless(metrics)


def test_an_nft_run_with_lora_keeps_an_old_copy_of_the_adapters_alone(init_run, tmp_path):
    train_nft(init_run, tmp_path / "run", "lora.enabled=true", "lora.rank=4", epochs=2)
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-2"
    adapters = load_file(next((checkpoint / "transformer_lora").glob("*.safetensors")))
    assert len(load_file(checkpoint / "nft_old_policy.safetensors")) == len(adapters)


def test_what_nft_cannot_train_is_refused_with_the_config(init_run, tmp_path):
    with pytest.raises(ConfigError, match=r"`nft\.sampler` is 'euler'.*not a sampler of .*whose samplers are ddim"):
        compose_config(nft_overrides(init_run, "nft.sampler=euler"))  # a flow sampler, for a v-prediction model
    with pytest.raises(ConfigError, match=r"`nft\.steps_per_sample` is 4.*3 of them"):
        compose_config(nft_overrides(init_run, "nft.steps_per_sample=4"))
    with pytest.raises(ConfigError, match=r"`diffusion\.objective` is 'epsilon'.*150 times"):
        (tmp_path / "trained").mkdir()
        epsilon = ["trainer.method=nft", f"model.pretrained={tmp_path / 'trained'}", "nft.prompts=[a red circle]"]
        compose_config([*TINY_SHAPES, *epsilon, "diffusion.objective=epsilon"])
    with pytest.raises(ConfigError, match=r"`nft\.beta` is 0\.5.*`trainer\.method=sft`, which reads no `nft\.\*`"):
        compose_config([*TINY_SHAPES, "nft.beta=0.5"])


def test_the_gradient_check_runs_on_a_few_rows_of_the_first_update(init_run, tmp_path):
    """As in the supervised step (``tests/training/test_trainer.py``): the eager check must not set the run's peak."""
    rows = rows_trained_in_a_step(build_trainer(compose_config(nft_overrides(init_run)), tmp_path))
    assert rows == [PREFLIGHT_ROWS, 8 * 2]  # the update: 8 images x 2 timesteps each
