"""``train.py`` and the scripts that read its run folder (``scripts/sample.py``, ``scripts/evaluate.py``) on tiny
configs: the shapes run, a recipe failing fast offline, W&B and Hydra's own command line as subprocesses, as users run
them; the other runs in this process (``run_here``), whose outcome is the point; and the commands the README gives
exist."""

import json
import time

import pytest
from PIL import Image

from ..conftest import REPO, read_metrics, run_here, run_script, train, train_here


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("shapes") / "run"
    result = train(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=15", "trainer.sample_every=30")
    return run_dir, result


@pytest.mark.slow
def test_shapes_run_writes_a_complete_run_folder(shapes_run):
    run_dir, result = shapes_run
    assert "Trained 30 steps" in result.stdout
    assert (run_dir / "config.yaml").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    for step in (15, 30):
        checkpoint = run_dir / "checkpoints" / f"checkpoint-{step}"
        for part in ("transformer", "transformer_ema"):
            assert (checkpoint / part / "diffusion_pytorch_model.safetensors").is_file()
            assert (checkpoint / part / "config.json").is_file()
        assert (checkpoint / "optimizer.bin").is_file()
    grid = Image.open(run_dir / "samples" / "step_0000030.png")
    width, height = grid.size  # 2 prompts x 4 seeds, 32 px tiles shown at 64 px, prompts in a left margin
    assert height == 2 * 64 and 4 * 64 + len("a red circle") * 6 <= width < 4 * 64 + 120
    assert Image.open(run_dir / "loss_curve.png").size[0] > 100


@pytest.mark.slow
def test_shapes_run_logs_every_metric_and_the_loss_goes_down(shapes_run):
    records = read_metrics(shapes_run[0])
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25, 30]
    for record in records:
        assert {"step", "loss", "lr", "grad_norm", "images_per_sec", "data/skipped"} <= set(record)
        assert record["images_per_sec"] > 0
        buckets = [key for key in record if key.startswith("loss/t_")]  # 80 samples: most tenths have some
        assert len(buckets) >= 6 and all(record[key] > 0 for key in buckets)
    assert records[-1]["loss"] < 0.9 * records[0]["loss"]


@pytest.mark.slow
def test_checkpoint_is_a_diffusers_model_folder(shapes_run):
    from diffusers import PixArtTransformer2DModel

    model = PixArtTransformer2DModel.from_pretrained(shapes_run[0] / "checkpoints" / "checkpoint-30" / "transformer")
    assert model.config.in_channels == 4 and model.config.sample_size == 16


@pytest.mark.slow
def test_sample_script_writes_images_and_an_index(shapes_run, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n\na blue square\n")
    out_dir = tmp_path / "out"
    result = run_here(
        [
            "scripts/sample.py",
            f"run_dir={shapes_run[0]}",
            f"prompt_file={prompts}",
            "images_per_prompt=3",
            f"out_dir={out_dir}",
            "steps=4",
            "seed=7",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    index = [json.loads(line) for line in (out_dir / "index.jsonl").read_text().splitlines()]
    assert [entry["prompt"] for entry in index] == ["a red circle"] * 3 + ["a blue square"] * 3
    assert [entry["seed"] for entry in index] == [7, 8, 9] * 2  # image j of every prompt: seed + j
    for entry in index:
        assert Image.open(out_dir / entry["file"]).size == (32, 32)


@pytest.mark.slow
def test_sample_script_rejects_an_empty_prompt_file(shapes_run, tmp_path):
    prompts = tmp_path / "empty.txt"
    prompts.write_text("\n\n")
    result = run_here(
        ["scripts/sample.py", f"run_dir={shapes_run[0]}", f"prompt_file={prompts}", f"out_dir={tmp_path / 'out'}"]
    )
    assert result.returncode == 2 and "no prompts" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_fallback_schedule_trains_and_warns_in_the_run_log(tmp_path):
    """The warning was a Python warning on the console only: the run's log could not say which schedule it used."""
    train_here(tmp_path / "run", "diffusion=fallback", "trainer.max_steps=5", "trainer.sample_every=5")
    assert (tmp_path / "run" / "samples" / "step_0000005.png").is_file()
    assert (
        "UserWarning: no `diffusion.scheduler` is configured; using the built-in fallback schedule"
        in (tmp_path / "run" / "train.log").read_text()
    )


@pytest.mark.slow
def test_pixel_space_imagefolder_run(tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    lines = []
    for index, mode in enumerate(["RGB", "L", "RGBA", "P"]):
        Image.new(mode, (40, 30), color=120 if mode in ("L", "P") else (200, 10, 10, 255)[: len(mode)]).save(
            data / f"{index}.png"
        )
        lines.append(json.dumps({"file_name": f"{index}.png", "caption": f"picture {index}"}))
    Image.new("RGB", (8, 8)).save(data / "unlisted.png")
    (data / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    train_here(
        run_dir,
        "data=imagefolder",
        f"data.path={data}",
        "data.caption_column=caption",
        "data.resolution=16",
        "data.num_workers=0",
        "vae=pixel",
        "trainer.batch_size=2",
        "trainer.max_steps=4",
        "trainer.log_every=2",
        "trainer.sample_every=4",
    )
    from diffusers import PixArtTransformer2DModel

    model = PixArtTransformer2DModel.from_pretrained(run_dir / "checkpoints" / "checkpoint-4" / "transformer")
    assert model.config.in_channels == 3 and model.config.sample_size == 16


# Each cluster recipe and the model its first load names offline (the VAE, loaded first).
CLUSTER_RECIPES = [
    ("dit", "stabilityai/sd-vae-ft-ema", "vae.pretrained"),
    ("pixart_sigma", "PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers", "vae.pretrained"),
    ("sd35_medium", "stabilityai/stable-diffusion-3.5-medium", "vae.pretrained"),
    ("flux_lora", "black-forest-labs/FLUX.1-dev", "vae.pretrained"),
    ("sana", "Efficient-Large-Model/Sana_1600M_1024px_diffusers", "vae.pretrained"),
    ("z_image", "Tongyi-MAI/Z-Image-Turbo", "vae.pretrained"),
    ("z_image_lora", "Tongyi-MAI/Z-Image-Turbo", "vae.pretrained"),
    ("qwen_image_lora", "Qwen/Qwen-Image", "vae.pretrained"),
    ("flux2_lora", "black-forest-labs/FLUX.2-klein-base-4B", "vae.pretrained"),
    ("wan21_t2v_1_3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "vae.pretrained"),
    ("wan21_t2v_14b_lora", "Wan-AI/Wan2.1-T2V-14B-Diffusers", "vae.pretrained"),
]


@pytest.mark.slow
def test_a_cluster_recipe_offline_fails_fast_naming_the_model(tmp_path):
    """train.py itself: exit 2 within a minute, one paragraph, no traceback (every recipe's message: below)."""
    experiment, model, key = CLUSTER_RECIPES[0]
    start = time.perf_counter()
    result = run_script(
        ["train.py", f"+experiment={experiment}", f"hydra.run.dir={tmp_path / 'run'}"],
        timeout=120,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert time.perf_counter() - start < 60
    assert model in result.stderr and f"{key}=DIR" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("experiment", "model", "key"), CLUSTER_RECIPES)
def test_every_cluster_recipe_offline_names_the_model_before_anything_is_written(tmp_path, experiment, model, key):
    """Composed and run as train.py runs it (in this process): the first model to load names itself and the key
    that points at a local copy, and no run folder is left."""
    from dit_trainer.errors import ModelLoadError

    from .family_runs import train_in_process

    with pytest.raises(ModelLoadError) as error:
        train_in_process(tmp_path / "run", f"+experiment={experiment}", base=())
    assert f"`{key}={model}`" in str(error.value) and f"{key}=DIR" in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_wandb_offline_writes_a_run_inside_the_run_folder_and_no_secret(tmp_path):
    run_dir = tmp_path / "run"
    secret = "sentinel-api-key-0123456789abcdef0123456789abcdef"
    result = train(
        run_dir,
        "logger=wandb",
        "logger.mode=offline",
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.sample_every=3",
        env={"WANDB_API_KEY": secret},
    )
    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert secret not in result.stdout + result.stderr
    assert not [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.slow
def test_tensorboard_writes_event_files(tmp_path):
    run_dir = tmp_path / "run"
    train_here(run_dir, "logger=tensorboard", "trainer.max_steps=3", "trainer.log_every=1", "trainer.sample_every=3")
    assert list((run_dir / "logs").rglob("events.out.tfevents.*"))


def test_the_readme_s_set_up_commands_exist_and_ci_runs_its_test_command():
    readme = (REPO / "README.md").read_text()
    assert "bash scripts/install.sh && python train.py +experiment=shapes" in readme
    ci_command = (REPO / ".ci/run").read_text().strip().splitlines()[-1]
    assert ci_command.startswith("bash scripts/install.sh test && python -m pytest") and ci_command in readme


@pytest.mark.slow
def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    run_dir = tmp_path / "run"
    train_here(
        run_dir,
        "trainer.gradient_accumulation_steps=2",
        "trainer.max_steps=4",
        "trainer.log_every=2",
        "trainer.sample_every=0",
        "trainer.checkpoint_every=0",
    )
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [2, 4]
    assert (run_dir / "checkpoints" / "checkpoint-4").is_dir()


@pytest.mark.slow
def test_evaluate_scores_with_rewards_given_on_the_command_line(shapes_run, tmp_path):
    result = run_here(
        [
            "scripts/evaluate.py",
            str(shapes_run[0]),
            "weights.jpeg_compressibility=1.0",
            "prompts=[a red circle]",
            "images_per_prompt=2",
            "steps=2",
            f"out_dir={tmp_path / 'eval'}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["rewards"] == {"jpeg_compressibility": 1.0} and report["reward/mean"] < 0
    assert set(report) >= {"color", "shape"} and len(report["per_prompt"][0]["rewards"]) == 2


def test_torch_is_required_where_weights_only_loading_is_safe():
    """torch.load(weights_only=True), which checkpoints use, can be bypassed before torch 2.6 (CVE-2025-32434); the
    package requires 2.6, and scripts/install.sh replaces an older torch instead of keeping it."""
    import tomllib

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=2.6" in dependencies
    install = (REPO / "scripts" / "install.sh").read_text()
    assert "torch.__version__ < '2.6'" in install and '"torch>=2.6"' in install


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["shapes", "dit_lora"])  # dit_lora: an experiment that inherits another
def test_cfg_job_prints_the_config(experiment):
    """Every experiment composes in-process (tests/config/test_experiments.py); here Hydra's own command line
    prints two of them."""
    result = run_script(["train.py", f"+experiment={experiment}", "--cfg", "job"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "trainer:" in result.stdout and "max_steps:" in result.stdout


@pytest.mark.slow
def test_a_run_on_a_deep_compression_autoencoder_trains_from_its_cache_and_samples(tmp_path):
    """`vae.kind=autoencoder_dc` (Sana's kind; here a tiny one saved by path): its deterministic latents are cached in
    memory, the loss falls and the sample grid decodes through it."""
    from ..components.test_vae import tiny_dc_autoencoder

    tiny_dc_autoencoder(tmp_path / "vae")
    run_dir = tmp_path / "run"
    train_here(run_dir, "vae.kind=autoencoder_dc", f"vae.pretrained={tmp_path / 'vae'}", "model.patch_size=2",
               "data.cache_latents=true", "trainer.max_steps=30", "trainer.log_every=1", "trainer.sample_every=30",
               "optim.lr=1e-3")  # fmt: skip
    losses = [record["loss"] for record in read_metrics(run_dir)]
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])
    assert list((run_dir / "samples").glob("*.png"))
