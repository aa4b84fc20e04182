"""``scripts/export.py``: a run's checkpoint as diffusers folders that reproduce our own sampler."""

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import torch
from diffusers import PixArtAlphaPipeline, PixArtSigmaPipeline
from safetensors.torch import load_file

from dit_trainer.apps.export import MANIFEST, _staging_dir, export_run
from dit_trainer.apps.inference import load_run
from dit_trainer.config import ExportConfig
from dit_trainer.errors import ConfigError
from dit_trainer.run_config import read_run_config

from ..conftest import QUICK, REPO, run_here, train_here, wait_for

PROMPTS, SEEDS = ["a red circle", "a blue square"], [3, 4]
_TOL = {"atol": 1e-4, "rtol": 1e-4}
GENERATE = {"height": 32, "width": 32, "use_resolution_binning": False, "clean_caption": False}


def _t5_run(root, tiny_t5_dir, *overrides: str):
    run_dir = root / "run"
    train_here(
        run_dir,
        *QUICK,
        f"conditioner.pretrained={tiny_t5_dir}",
        "conditioner.kind=t5",
        "conditioner.subfolder=text_encoder",
        "conditioner.tokenizer_subfolder=tokenizer",
        "conditioner.max_length=8",
        "conditioner.memo_size=0",
        *overrides,
    )
    return run_dir


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory, tiny_t5_dir):
    return _t5_run(tmp_path_factory.mktemp("export_t5"), tiny_t5_dir)


@pytest.fixture(scope="module")
def sigma_run(tmp_path_factory, tiny_t5_dir):
    return _t5_run(tmp_path_factory.mktemp("export_sigma"), tiny_t5_dir, "model.family=pixart_sigma")


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("export_minilm") / "run"
    train_here(run_dir, *QUICK)
    return run_dir


def _our_images_and_noise(run_dir, steps=2, guidance_scale=3.0):
    """Our sampler's images for PROMPTS/SEEDS, and the initial noise it drew (one generator per seed)."""
    run = load_run(run_dir, device="cpu")
    images = run.generate_images(PROMPTS, SEEDS, run.settings(steps, guidance_scale))
    shape = run.text_to_image.latent_shape
    noise = torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in SEEDS])
    return run, images, noise


@pytest.mark.slow
def test_t5_run_exports_a_pixart_pipeline_that_matches_our_sampler(t5_run):
    _exports_a_pipeline_that_matches_our_sampler(t5_run, PixArtAlphaPipeline)


@pytest.mark.slow
def test_a_pixart_sigma_run_exports_a_sigma_pipeline_that_matches_our_sampler(sigma_run):
    _exports_a_pipeline_that_matches_our_sampler(sigma_run, PixArtSigmaPipeline)


def _exports_a_pipeline_that_matches_our_sampler(t5_run, pipeline_class):
    result = run_here(["scripts/export.py", str(t5_run)])
    assert result.returncode == 0, result.stderr[-3000:]
    folder = t5_run / "export" / "checkpoint-2"
    assert f"{pipeline_class.__name__}.from_pretrained" in result.stdout and str(folder) in result.stdout
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == pipeline_class.__name__
    for part in ("transformer", "vae", "text_encoder", "tokenizer", "scheduler", "model_index.json", MANIFEST):
        assert (folder / part).exists(), part
    assert "decay" not in json.loads((folder / "transformer" / "config.json").read_text())  # EMA bookkeeping

    pipe = pipeline_class.from_pretrained(folder)
    assert pipe.vae.config.latents_mean is None and pipe.vae.config.latents_std is None
    run, ours, noise = _our_images_and_noise(t5_run)
    theirs = pipe(
        PROMPTS, latents=noise, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=8,
        output_type="pt", **GENERATE,
    ).images  # fmt: skip
    assert theirs.shape == (2, 3, 32, 32)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)

    # The folded VAE speaks our normalised latent space / scaling_factor, both ways.
    ours_vae = run.text_to_image.vae
    scale = pipe.vae.config.scaling_factor
    z = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    decoded = pipe.vae.decode(z / scale).sample.clamp(-1, 1)
    torch.testing.assert_close(decoded, ours_vae.decode(z), atol=1e-4, rtol=0)
    images = ours_vae.decode(z)
    torch.testing.assert_close(pipe.vae.encode(images).latent_dist.mean * scale, ours_vae.encode(images), **_TOL)


@pytest.mark.slow
def test_export_casts_to_the_requested_dtype(t5_run, tmp_path):
    out_dir = tmp_path / "bf16"
    export_run(ExportConfig(run_dir=str(t5_run), out_dir=str(out_dir), dtype="bfloat16", sampler="dpmsolver++"))
    for weights in ["transformer/diffusion_pytorch_model", "vae/diffusion_pytorch_model", "text_encoder/model"]:
        assert {t.dtype for t in load_file(out_dir / f"{weights}.safetensors").values()} == {torch.bfloat16}
    scheduler = json.loads((out_dir / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "DPMSolverMultistepScheduler"
    assert "torch_dtype=torch.bfloat16" in json.loads((out_dir / MANIFEST).read_text())["usage"]


@pytest.mark.slow
def test_a_flow_matching_run_exports_a_recipe_that_reproduces_our_euler_sampler(tmp_path):
    """PixArtAlphaPipeline expects two scheduler members FlowMatchEulerDiscreteScheduler lacks; the printed recipe
    supplies them, and the pipeline then matches our sampler (without them it fails on ``init_noise_sigma``)."""
    run_dir = tmp_path / "flow_run"
    train_here(run_dir, *QUICK, "diffusion=flow", "diffusion.objective=flow_matching", "diffusion.shift=3")
    result = export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(tmp_path / "flow_export")))
    assert result.manifest["scheduler_class"] == "FlowMatchEulerDiscreteScheduler"
    namespace = {}
    exec(result.usage.split("image = pipe(")[0], namespace)
    run, ours, noise = _our_images_and_noise(run_dir, steps=3)
    theirs = namespace["pipe"](
        PROMPTS, latents=noise, num_inference_steps=3, guidance_scale=3.0, max_sequence_length=8,
        output_type="pt", **GENERATE,
    ).images  # fmt: skip
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def _export_cli(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("export_script", REPO / "scripts" / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


@pytest.mark.slow
def test_export_refuses_a_non_empty_out_dir_and_leaves_it_untouched(minilm_run, tmp_path, capsys):
    out_dir = tmp_path / "taken"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    assert _export_cli([str(minilm_run), f"out_dir={out_dir}"]) == 2
    error = capsys.readouterr().err
    assert "`out_dir`" in error and "a folder that already holds files" in error and "Traceback" not in error
    assert [p.name for p in out_dir.iterdir()] == ["keep.txt"] and (out_dir / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no staging folder left behind

    blocked = tmp_path / "file"
    blocked.write_text("")
    assert _export_cli([str(minilm_run), f"out_dir={blocked / 'sub'}"]) == 2
    assert "cannot be written" in capsys.readouterr().err

    # Among the checkpoints it was read as a damaged one by every sample and resume, and set aside by one.
    checkpoints = sorted(p.name for p in (minilm_run / "checkpoints").iterdir())
    assert _export_cli([str(minilm_run), f"out_dir={minilm_run / 'checkpoints' / 'checkpoint-99'}"]) == 2
    assert "inside the run's checkpoints folder" in capsys.readouterr().err
    assert sorted(p.name for p in (minilm_run / "checkpoints").iterdir()) == checkpoints


@pytest.mark.slow
def test_export_explains_a_folder_that_is_not_a_run_or_a_pixel_run(tmp_path, minilm_run):
    result = run_here(["scripts/export.py", str(tmp_path)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no config.yaml" in result.stderr

    pixel = tmp_path / "pixel_run"
    pixel.mkdir()
    config = (minilm_run / "config.yaml").read_text()
    (pixel / "config.yaml").write_text(config.replace("kind: autoencoder_kl", "kind: pixel", 1))
    with pytest.raises(ConfigError, match="pixel space"):
        export_run(ExportConfig(run_dir=str(pixel)))
    fresh = tmp_path / "fresh_run"
    fresh.mkdir()
    (fresh / "config.yaml").write_text(config)
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        export_run(ExportConfig(run_dir=str(fresh)))
    with pytest.raises(ConfigError, match="float32, bfloat16, float16"):
        export_run(ExportConfig(run_dir=str(minilm_run), dtype="float8"))


@pytest.mark.slow
def test_a_run_config_from_another_version_is_explained(tmp_path, minilm_run):
    """A key this version does not know (here `data.center_crop`, since renamed to `data.crop`) names the key, its
    value and the file to edit, instead of OmegaConf's merge error."""
    config = (minilm_run / "config.yaml").read_text()
    assert "\n  crop: center\n" in config
    (tmp_path / "config.yaml").write_text(config.replace("\n  crop: center\n", "\n  center_crop: true\n", 1))
    with pytest.raises(ConfigError, match="another version") as caught:
        read_run_config(tmp_path)
    message = str(caught.value)
    assert "`data.center_crop` is True" in message and str(tmp_path / "config.yaml") in message


def _staging_folders(parent) -> list:
    return sorted(p for p in parent.iterdir() if ".partial-" in p.name)


@pytest.mark.slow
def test_a_killed_export_s_staging_folder_is_removed_by_the_next_export_and_no_other(minilm_run, tmp_path):
    out_dir = tmp_path / "export"
    process = subprocess.Popen([sys.executable, "scripts/export.py", str(minilm_run), f"out_dir={out_dir}"], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(lambda: _staging_folders(tmp_path), process, timeout=120)
    process.kill()
    process.wait()
    killed = _staging_folders(tmp_path)
    assert len(killed) == 1 and not out_dir.exists()

    running = _staging_dir(out_dir)  # named by this process, which runs: another export in progress
    unrecognised = tmp_path / ".export.partial-not-written-by-an-export"
    unrecognised.mkdir()
    other_export = tmp_path / ".other.partial-x"
    other_export.mkdir()
    export_run(ExportConfig(run_dir=str(minilm_run), out_dir=str(out_dir)))
    assert not killed[0].exists() and (out_dir / MANIFEST).is_file()
    assert running.is_dir() and unrecognised.is_dir() and other_export.is_dir()


@pytest.mark.slow
def test_an_export_moved_with_its_run_stays_valid(minilm_run, tmp_path, monkeypatch):
    """The manifest records paths relative to the export folder, and its usage loads the folder it lies in."""
    run_dir = tmp_path / "run"
    shutil.copytree(minilm_run, run_dir)
    export_run(ExportConfig(run_dir=str(run_dir)))
    moved = tmp_path / "moved"
    run_dir.rename(moved)
    folder = moved / "export" / "checkpoint-2"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert (folder / manifest["run_dir"]).resolve() == moved.resolve()
    assert not [p for p in folder.rglob("*") if p.is_file() and str(tmp_path).encode() in p.read_bytes()]

    monkeypatch.chdir(folder)
    namespace = {}
    exec(manifest["usage"].split("image = pipe(")[0], namespace)
    assert namespace["pipe"].transformer.config.in_channels == 4
