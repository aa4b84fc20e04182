"""LoRA runs of ``train.py``: checkpoints hold only the adapter in peft's format, a resumed run continues them exactly,
and the sample and export scripts load base + adapter."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import QUIET, lora_overrides, read_metrics, run_here, train_here


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, tiny_pixart_dir):
    root = tmp_path_factory.mktemp("lora")
    common = (*lora_overrides(tiny_pixart_dir), *QUIET, "trainer.checkpoint_every=3", "optim.warmup_steps=2")
    train_here(root / "straight", "trainer.max_steps=6", *common)
    train_here(root / "resumed", "trainer.max_steps=3", *common)
    train_here(root / "resumed", "trainer.max_steps=6", "trainer.resume=latest", *common)
    return root


@pytest.mark.slow
def test_a_lora_checkpoint_holds_only_the_adapter_in_peft_format(lora_runs, tiny_pixart_dir):
    checkpoint = lora_runs / "straight" / "checkpoints" / "checkpoint-6"
    assert not (checkpoint / "transformer").exists()
    for part in ("transformer_lora", "transformer_lora_ema"):
        assert json.loads((checkpoint / part / "adapter_config.json").read_text())["r"] == 4
    adapter = (checkpoint / "transformer_lora" / "adapter_model.safetensors").stat().st_size
    base = (tiny_pixart_dir / "diffusion_pytorch_model.safetensors").stat().st_size
    assert adapter < 0.2 * base


@pytest.mark.slow
def test_a_resumed_lora_run_matches_the_uninterrupted_one_and_keeps_training(lora_runs):
    straight = {r["step"]: r["loss"] for r in read_metrics(lora_runs / "straight")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(lora_runs / "resumed")}
    assert sorted(resumed) == list(range(1, 7))
    assert [resumed[s] for s in range(4, 7)] == pytest.approx([straight[s] for s in range(4, 7)], rel=1e-6)
    checkpoints = lora_runs / "resumed" / "checkpoints"
    at_3 = load_file(checkpoints / "checkpoint-3" / "transformer_lora" / "adapter_model.safetensors")
    at_6 = load_file(checkpoints / "checkpoint-6" / "transformer_lora" / "adapter_model.safetensors")
    lora_b = [name for name in at_3 if "lora_B" in name]
    assert lora_b and all(not torch.equal(at_3[name], at_6[name]) for name in lora_b)


@pytest.mark.slow
def test_sample_and_export_load_base_plus_adapter(lora_runs, tmp_path):
    from diffusers import PixArtTransformer2DModel

    from dit_trainer.apps.export import export_run
    from dit_trainer.apps.inference import load_run
    from dit_trainer.config import ExportConfig

    run_dir = lora_runs / "straight"
    result = run_here(
        ["scripts/sample.py", f"run_dir={run_dir}", "prompts=[a red circle]", "images_per_prompt=1", "steps=2",
         f"out_dir={tmp_path / 'samples'}"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "samples" / "00000.png").is_file()

    export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(tmp_path / "export")))
    merged = PixArtTransformer2DModel.from_pretrained(tmp_path / "export" / "transformer")
    assert not any("lora" in name or "modules_to_save" in name for name in merged.state_dict())
    run = load_run(run_dir, device="cpu")  # EMA adapter, as the export
    x, t = torch.randn(1, 4, 16, 16), torch.tensor([500])
    embeds = torch.randn(1, 8, 384)
    kwargs = {"timestep": t, "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}, "return_dict": False}
    with torch.no_grad():
        ours = run.dit.transformer(x, encoder_hidden_states=embeds, **kwargs)[0]
        theirs = merged(x, encoder_hidden_states=embeds, **kwargs)[0]
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
