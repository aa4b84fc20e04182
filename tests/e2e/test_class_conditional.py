"""The class-conditional DiT (``model.family=dit``, DiTTransformer2DModel) through ``train.py`` and the scripts: it
trains on class sub-folders through the same trainer as PixArt, resumes exactly, samples by class name, exports a
DiTPipeline that reproduces our sampler, and its CPU recipe draws digits a classifier recognises."""

import json

import pytest
import torch
from diffusers import DiTPipeline

from dit_trainer.apps.inference import load_run

from ..conftest import QUICK, class_conditional, read_metrics, run_here, train_here

DIGIT_CLASSES = [str(digit) for digit in range(10)]


@pytest.mark.slow
def test_a_class_conditional_dit_trains_resumes_exactly_and_samples_by_class(digits, tmp_path):
    common = [*class_conditional(digits), "trainer.log_every=1", "trainer.checkpoint_every=15", "optim.lr=1e-3"]
    train_here(tmp_path / "straight", *common, "trainer.max_steps=30")
    train_here(tmp_path / "resumed", *common, "trainer.max_steps=30",
          f"trainer.resume={tmp_path / 'straight' / 'checkpoints' / 'checkpoint-15'}")  # fmt: skip
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "resumed")}
    assert sum(straight[s] for s in range(26, 31)) < sum(straight[s] for s in range(1, 6))  # it learns
    assert [resumed[s] for s in range(16, 31)] == pytest.approx([straight[s] for s in range(16, 31)], rel=1e-6)

    out = tmp_path / "samples"
    result = run_here(["scripts/sample.py", f"run_dir={tmp_path / 'straight'}", "prompts=[3,seven]",
                         "images_per_prompt=1", f"out_dir={out}", "steps=2"])  # fmt: skip
    assert result.returncode == 2 and "`prompts` is 'seven'" in result.stderr  # not a class: refused, no traceback
    result = run_here(["scripts/sample.py", f"run_dir={tmp_path / 'straight'}", "prompts=[3,7]",
                         "images_per_prompt=1", f"out_dir={out}", "steps=2"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads(line)["prompt"] for line in (out / "index.jsonl").read_text().splitlines()] == ["3", "7"]


@pytest.mark.slow
def test_a_class_conditional_run_exports_a_dit_pipeline_that_matches_our_sampler(digits, tmp_path):
    run_dir = tmp_path / "run"
    train_here(run_dir, *class_conditional(digits, "vae=shapes", "data.resolution=32"), *QUICK)  # fmt: skip
    result = run_here(["scripts/export.py", str(run_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    folder = run_dir / "export" / "checkpoint-2"
    manifest = json.loads((folder / "dit_trainer_export.json").read_text())
    # DiTPipeline's null class is id 1000 (hard-coded): the export widens the label tables so that it is ours, and
    # the pipeline's classifier-free guidance is ours; its get_label_ids knows the class names.
    assert manifest["classes"] == {"names": DIGIT_CLASSES, "null_class": 1000}
    pipe = DiTPipeline.from_pretrained(folder)
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(["3", "7"], [5, 6], run.settings(2, 3.0))
    generators = [torch.Generator().manual_seed(seed) for seed in (5, 6)]
    theirs = pipe(class_labels=pipe.get_label_ids(["3", "7"]), guidance_scale=3.0, generator=generators,
                  num_inference_steps=2, output_type="pt").images  # fmt: skip
    torch.testing.assert_close(torch.as_tensor(theirs), ours, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_verify_gradients_passes_the_class_conditional_recipe(digits):
    result = run_here(["scripts/verify_gradients.py", "+experiment=dit_digits", f"data.path={digits}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK: training trains the DiT and nothing else." in result.stdout


@pytest.mark.slow
def test_the_digits_recipe_draws_digits_a_classifier_recognises(digits, tmp_path):
    """The CPU class-conditional recipe, shortened: after 400 steps the classifier fitted on the real digits reads
    most samples as the digit asked for (chance: 10 %; the full 3,000-step recipe reaches 100 % of 500)."""
    run = tmp_path / "run"
    result = run_here(["train.py", "+experiment=dit_digits", f"data.path={digits}", f"hydra.run.dir={run}",
                       "trainer.max_steps=400", "monitor.reward.every_n_steps=400", "validation.every_n_steps=0",
                       "trainer.sample_every=0", "trainer.checkpoint_every=0"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = next(r["reward/mean"] for r in read_metrics(run) if "reward/mean" in r)
    assert accuracy >= 0.7
