"""Model families: the class-conditional DiT (DiTTransformer2DModel) trains through the same trainer as PixArt, on
class sub-folders, samples by class name, resumes exactly and exports a DiTPipeline that reproduces our sampler."""

import json

import pytest
import torch
from diffusers import DiTPipeline
from diffusers.models.embeddings import LabelEmbedding

from dit_trainer.components.dit import build_dit
from dit_trainer.config import ModelConfig
from dit_trainer.data.digits import write_digits_folder
from dit_trainer.errors import ConfigError
from dit_trainer.inference import load_run

from .conftest import TINY_SHAPES, compose_config, read_metrics, run_script, train

DIGIT_CLASSES = [str(digit) for digit in range(10)]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digits_folder(tmp_path_factory.mktemp("digits") / "digits", resolution=16)


def _class_conditional(folder, *extra: str) -> list[str]:
    """TINY_SHAPES' trainer with a 2-layer DiT on the digits in pixel space."""
    return ["model.family=dit", "text_encoder.kind=class_labels", "data=imagefolder", f"data.path={folder}",
            "data.resolution=16", "data.num_workers=0", "vae=pixel", "trainer.sample_prompts=[3,7]",
            *extra]  # fmt: skip


def test_a_tiny_dit_saved_by_path_loads_predicts_and_keeps_label_dropout_to_the_trainer(tmp_path):
    cfg = ModelConfig(family="dit", num_layers=1, num_attention_heads=2, attention_head_dim=8, patch_size=2)
    build_dit(cfg, in_channels=4, sample_size=8, condition_dim=10).transformer.save_pretrained(tmp_path / "dit")
    dit = build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, 10)
    labels = torch.tensor([3, 10])  # a class and the null class
    assert dit(torch.randn(2, 4, 8, 8), torch.tensor([500]), labels).shape == (2, 4, 8, 8)
    tables = [module for module in dit.transformer.modules() if isinstance(module, LabelEmbedding)]
    assert tables and all(table.dropout_prob == 0 and table.embedding_table.num_embeddings == 11 for table in tables)
    with pytest.raises(ConfigError, match=r"`model\.pretrained`.*10 classes while `text_encoder\.classes` lists 12"):
        build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, 12)


def test_classes_are_read_from_the_sub_folders_and_checked(digits):
    cfg = compose_config([*TINY_SHAPES, *_class_conditional(digits)])
    assert cfg.text_encoder.classes == DIGIT_CLASSES
    with pytest.raises(ConfigError, match=r"`text_encoder\.kind`.*conditioned on class labels"):
        compose_config([*TINY_SHAPES, "model.family=dit"])
    with pytest.raises(ConfigError, match=r"`text_encoder\.kind`.*conditioned on text"):
        compose_config([*TINY_SHAPES, *_class_conditional(digits), "model.family=pixart_alpha"])
    with pytest.raises(ConfigError, match=r"`trainer\.sample_prompts`.*\['cat'\].*class names or ids"):
        compose_config([*TINY_SHAPES, *_class_conditional(digits), "trainer.sample_prompts=[cat]"])
    with pytest.raises(ConfigError, match=r"`privacy\.mode` is 'ghost'.*privacy\.mode=hooks"):
        compose_config(
            [*TINY_SHAPES, *_class_conditional(digits), "privacy.enabled=true", "privacy.noise_multiplier=1"]
        )


@pytest.mark.slow
def test_a_class_conditional_dit_trains_resumes_exactly_and_samples_by_class(digits, tmp_path):
    common = [*_class_conditional(digits), "trainer.log_every=1", "trainer.checkpoint_every=15", "optim.lr=1e-3"]
    train(tmp_path / "straight", *common, "trainer.max_steps=30")
    train(tmp_path / "resumed", *common, "trainer.max_steps=30",
          f"trainer.resume={tmp_path / 'straight' / 'checkpoints' / 'checkpoint-15'}")  # fmt: skip
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "resumed")}
    assert sum(straight[s] for s in range(26, 31)) < sum(straight[s] for s in range(1, 6))  # it learns
    assert [resumed[s] for s in range(16, 31)] == pytest.approx([straight[s] for s in range(16, 31)], rel=1e-6)

    out = tmp_path / "samples"
    result = run_script(["scripts/sample.py", f"run_dir={tmp_path / 'straight'}", "prompts=[3,seven]",
                         "images_per_prompt=1", f"out_dir={out}", "steps=2"])  # fmt: skip
    assert result.returncode == 2 and "`prompts` is 'seven'" in result.stderr  # not a class: refused, no traceback
    result = run_script(["scripts/sample.py", f"run_dir={tmp_path / 'straight'}", "prompts=[3,7]",
                         "images_per_prompt=1", f"out_dir={out}", "steps=2"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads(line)["prompt"] for line in (out / "index.jsonl").read_text().splitlines()] == ["3", "7"]


@pytest.mark.slow
def test_a_class_conditional_run_exports_a_dit_pipeline_that_matches_our_sampler(digits, tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, *_class_conditional(digits, "vae=shapes", "data.resolution=32"), "trainer.max_steps=2",
          "trainer.sample_every=0")  # fmt: skip
    result = run_script(["scripts/export.py", str(run_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    folder = run_dir / "export" / "checkpoint-2"
    manifest = json.loads((folder / "dit_trainer_export.json").read_text())
    assert manifest["classes"] == {"names": DIGIT_CLASSES, "null_class": 10}
    pipe = DiTPipeline.from_pretrained(folder)
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(["3", "7"], [5, 6], run.settings(2, 1.0))
    generators = [torch.Generator().manual_seed(seed) for seed in (5, 6)]
    theirs = pipe(class_labels=[3, 7], guidance_scale=1.0, generator=generators, num_inference_steps=2,
                  output_type="pt").images  # fmt: skip
    torch.testing.assert_close(torch.as_tensor(theirs), ours, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_verify_gradients_passes_the_class_conditional_recipe(digits):
    result = run_script(["scripts/verify_gradients.py", "+experiment=dit_digits", f"data.path={digits}"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK: training trains the DiT and nothing else." in result.stdout


@pytest.mark.slow
def test_the_digits_recipe_draws_digits_a_classifier_recognises(digits, tmp_path):
    """The CPU class-conditional recipe, shortened: after 400 steps the classifier fitted on the real digits reads
    most samples as the digit asked for (chance: 10 %; the full 3,000-step recipe reaches 100 % of 500)."""
    run = tmp_path / "run"
    result = run_script(["train.py", "+experiment=dit_digits", f"data.path={digits}", f"hydra.run.dir={run}",
                         "trainer.max_steps=400", "monitor.grpo.every_n_steps=400", "validation.every_n_steps=0",
                         "trainer.sample_every=0", "trainer.checkpoint_every=0"], timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = next(r["reward/mean"] for r in read_metrics(run) if "reward/mean" in r)
    assert accuracy >= 0.7
