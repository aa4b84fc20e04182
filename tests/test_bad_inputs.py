"""The bad-input table: each bad value, path or file gets one paragraph naming the problem and the fix, and nothing
already written (a checkpoint, the metrics) is modified."""

import hashlib
import io
import json
import shutil

import pytest
import torch
from PIL import Image

from dit_trainer.data.cache import open_cache
from dit_trainer.data.precompute import precompute
from dit_trainer.errors import ConfigError, ModelLoadError

from .conftest import TINY_SHAPES, compose_config, run_script, train

# (override, the key the message must name, a fragment of the value or reason)
CONFIG_VALUES = [
    ("diffusion.objective=x0", "diffusion.objective", "'x0'"),
    ("optim.lr=-1", "optim.lr", "-1"),
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
    ("monitor.grpo.group_size=1", "monitor.grpo.group_size", "1"),
    ("+reward.weights.aesthetic=1.0", "reward.weights.aesthetic", "aesthetic"),
    ("reward.jpeg_quality=0", "reward.jpeg_quality", "0"),
    ("lora.enabled=true", "model.pretrained", "pretrained DiT"),
    ("data=imagefolder", "data.path", "None"),
    ("data=imagefolder data.path=/no/such/folder", "data.path", "metadata.jsonl"),
    ("monitor.grpo.prompt_file=/no/such/prompts.txt", "monitor.grpo.prompt_file", "no such file"),
]


@pytest.mark.parametrize(("overrides", "key", "fragment"), CONFIG_VALUES)
def test_a_bad_config_value_is_one_paragraph_naming_key_and_fix(overrides, key, fragment):
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", *overrides.split()])
    message = str(caught.value)
    assert f"`{key}`" in message and fragment in message
    assert "\n" not in message and "To fix it" in message


def test_an_empty_prompt_file_is_refused(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n  \n")
    with pytest.raises(ConfigError, match="no prompts were given"):
        compose_config(["+experiment=shapes", f"monitor.grpo.prompt_file={prompts}"])


@pytest.mark.parametrize("key", ["vae.pretrained", "text_encoder.pretrained", "model.pretrained"])
def test_a_missing_model_folder_names_its_key(key, tmp_path):
    with pytest.raises(ModelLoadError) as caught:
        compose_config(["+experiment=shapes", f"{key}=org/no-such-model-{tmp_path.name}"])
    assert f"{key}=org/no-such-model" in str(caught.value) and f"{key}=DIR" in str(caught.value)


def _digest(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bad_inputs") / "run"
    train(run_dir, "trainer.max_steps=2", "trainer.log_every=1", "trainer.sample_every=0")
    return run_dir


def _refused(run_dir, *overrides: str, into=None) -> str:
    """Run train.py with ``overrides`` into ``into`` (default: the finished run); it must exit 2 without a
    traceback and leave the finished run's files (checkpoints, metrics, config) as they were. Returns stderr."""
    owned = ("checkpoints", "metrics", "config.yaml")
    before = _digest(run_dir)
    result = run_script(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={into or run_dir}", "trainer.sample_every=0", *overrides],
        timeout=240,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert {k: v for k, v in _digest(run_dir).items() if k.startswith(owned)} == {
        k: v for k, v in before.items() if k.startswith(owned)
    }
    return result.stderr


@pytest.mark.slow
def test_a_fresh_run_over_a_finished_one_is_refused(finished_run):
    assert "already holds checkpoints" in _refused(finished_run, "trainer.max_steps=4")


@pytest.mark.slow
def test_resuming_from_a_folder_that_is_not_a_checkpoint_is_refused(finished_run, tmp_path):
    stderr = _refused(finished_run, "trainer.max_steps=4", f"trainer.resume={tmp_path}", into=tmp_path / "new")
    assert "`trainer.resume`" in stderr and "not a checkpoint folder" in stderr


@pytest.mark.slow
def test_resuming_a_checkpoint_of_another_model_shape_is_refused(finished_run, tmp_path):
    """Refused from the checkpoint's recorded config; with the change allowed, from the weights themselves."""
    checkpoint = finished_run / "checkpoints" / "checkpoint-2"
    stderr = _refused(finished_run, "model.num_layers=3", f"trainer.resume={checkpoint}", into=tmp_path / "new")
    assert "another model, data or objective: model.num_layers (2 -> 3)" in stderr
    assert "trainer.allow_config_change=true" in stderr
    stderr = _refused(finished_run, "model.num_layers=3", f"trainer.resume={checkpoint}",
                      "trainer.allow_config_change=true", into=tmp_path / "new")  # fmt: skip
    assert "its weights do not fit the configured model" in stderr and "config.yaml" in stderr


@pytest.mark.slow
def test_resuming_a_truncated_checkpoint_is_refused(finished_run, tmp_path):
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(finished_run / "checkpoints" / "checkpoint-2", copy)
    weights = copy / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    stderr = _refused(finished_run, f"trainer.resume={copy}", into=tmp_path / "new")
    assert "not a complete checkpoint" in stderr and "diffusion_pytorch_model.safetensors" in stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("metadata", "expected"),
    [("", "lists no images"), ('{"file_name": "a.png", "text": "x"}\nnot json\n', "line 2")],
    ids=["empty", "not-json"],
)
def test_a_bad_image_folder_is_refused(finished_run, tmp_path, metadata, expected):
    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.jsonl").write_text(metadata)
    stderr = _refused(finished_run, "data=imagefolder", f"data.path={data}", "vae=pixel", "data.resolution=16",
                      into=tmp_path / "new")  # fmt: skip
    assert "metadata.jsonl" in stderr or "`data.path`" in stderr
    assert expected in stderr


@pytest.mark.slow
def test_a_missing_prompt_file_for_sampling_is_refused(finished_run, tmp_path):
    result = run_script(["scripts/sample.py", f"run_dir={finished_run}", f"prompt_file={tmp_path / 'nope.txt'}",
                         f"out_dir={tmp_path / 'out'}"])  # fmt: skip
    assert result.returncode == 2 and "no such file" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_unwritable_run_folder_is_refused_before_anything_is_written(finished_run, tmp_path):
    blocker = tmp_path / "a_file"  # as root no permission bit stops a write; a file where a folder must be does
    blocker.write_text("")
    stderr = _refused(finished_run, into=blocker / "run")
    assert "`hydra.run.dir`" in stderr and f"{blocker} is a file" in stderr and "To fix it" in stderr


@pytest.mark.slow
def test_the_metrics_of_a_refused_resume_are_kept(finished_run):
    records = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]


# Run folders and resumes (issue 17)


@pytest.mark.slow
def test_resuming_with_other_data_or_objective_is_refused_listing_the_keys(finished_run):
    """A different experiment in the same folder must not continue the first one's weights; the refused attempt
    leaves config.yaml describing the run that is there."""
    stderr = _refused(finished_run, "trainer.resume=latest", "trainer.max_steps=4", "data.length=300",
                      "diffusion.objective=epsilon", "optim.lr=0.01")  # fmt: skip
    assert "data.length (256 -> 300)" in stderr and "diffusion.objective ('v_prediction' -> 'epsilon')" in stderr
    assert "optim.lr" not in stderr.partition("Invalid config")[2]  # a change of how, not what, is trained


@pytest.mark.slow
def test_resuming_with_another_number_of_processes_is_refused(finished_run, tmp_path):
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(finished_run / "checkpoints" / "checkpoint-2", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "world_size": 2}))
    stderr = _refused(finished_run, f"trainer.resume={copy}", "trainer.max_steps=4", into=tmp_path / "new")
    assert "written by 2 processes and this run has 1" in stderr and "--num_processes 2" in stderr


# Data inputs (issue 17)

DATA_SMALL = [*TINY_SHAPES, "data.length=8", "data.cache_dtype=float32"]


def _one_paragraph(error: Exception, key: str) -> str:
    message = str(error)
    assert f"`{key}`" in message and "\n" not in message and "To fix it" in message, message
    return message


def _png(size=(16, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "files",
    [{"shard-000000.tar": b"a webdataset shard", "shard-000001.tar": b"another"},
     {"shard-00000-00000.safetensors": b"left by an unfinished precompute", "notes.txt": b"the user's"}],
    ids=["webdataset-shards", "a-cache-shard-beside-a-user-file"],
)  # fmt: skip
def test_precompute_into_a_folder_of_other_files_is_refused_and_deletes_nothing(tmp_path, files):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    before = _digest(tmp_path)
    with pytest.raises(ConfigError) as caught:
        precompute(compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path}"]))
    assert "not part of a cache" in _one_paragraph(caught.value, "data.cache_dir")
    assert _digest(tmp_path) == before


def test_a_cache_dir_that_is_a_file_is_refused(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(b"a webdataset shard")
    with pytest.raises(ConfigError) as caught:
        precompute(compose_config([*DATA_SMALL, f"data.cache_dir={shard}"]))
    assert "is a file" in _one_paragraph(caught.value, "data.cache_dir")
    assert shard.read_bytes() == b"a webdataset shard"


@pytest.mark.parametrize("index", [b"not json", b'{"version": 3}', b"[1, 2]", b"\xff\xfe{}"])
def test_a_folder_whose_index_json_is_not_a_cache_index_is_refused_and_kept(tmp_path, index):
    (tmp_path / "index.json").write_bytes(index)
    (tmp_path / "shard-000000.tar").write_bytes(b"a webdataset shard")
    before = _digest(tmp_path)
    cfg = compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path}"])
    for use in (lambda: open_cache(cfg, torch.device("cpu")), lambda: precompute(cfg)):
        with pytest.raises(ConfigError) as caught:
            use()
        assert "not written by" in _one_paragraph(caught.value, "data.cache_dir")
    assert _digest(tmp_path) == before


def _tiny_image_folder(root, count: int) -> str:
    for i in range(count):
        (root / f"{i}.png").write_bytes(_png())
    (root / "metadata.jsonl").write_text("".join(f'{{"file_name": "{i}.png", "text": "a red square"}}\n'
                                                 for i in range(count)))  # fmt: skip
    return str(root)


def _small_data(tmp_path, source: str) -> list[str]:
    """Overrides for a data set of 8 (shapes, its disk cache, DP) or 3 (imagefolder) items, batch size 16."""
    if source == "imagefolder":
        folder = tmp_path / "images"
        folder.mkdir()
        return [*TINY_SHAPES, "data=imagefolder", f"data.path={_tiny_image_folder(folder, 3)}", "vae=pixel",
                "data.resolution=16", "data.num_workers=0"]  # fmt: skip
    if source == "cache":
        precompute(compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path / 'cache'}"]))
        return [*DATA_SMALL, f"data.cache_dir={tmp_path / 'cache'}"]
    if source == "dp":
        return ["+experiment=shapes_dp", *TINY_SHAPES[1:], "data.length=8"]
    return DATA_SMALL


@pytest.mark.parametrize("source", ["shapes", "imagefolder", "cache", "dp"])
def test_a_data_set_smaller_than_one_batch_is_refused_before_training(tmp_path, source):
    from dit_trainer.training.run import run

    cfg = compose_config([*_small_data(tmp_path, source), "validation.every_n_steps=500", "validation.split=0.032"])
    with pytest.raises(ConfigError) as caught:
        run(cfg, tmp_path / "run")
    message = _one_paragraph(caught.value, "trainer.batch_size")
    size = 2 if source == "imagefolder" else 7  # of 3 or 8: one is held out for validation
    assert f"is 16, but the data set has {size} items to train on (1 more are held out" in message
    assert f"trainer.batch_size={size}" in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "content",
    [b"a red circle\n\xe9t\xe9 \xe0 la plage\n", "a red circle\n".encode("utf-16")],
    ids=["latin-1", "utf-16"],
)
def test_a_prompt_file_that_is_not_utf8_is_refused(tmp_path, content):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", f"monitor.grpo.prompt_file={prompts}"])
    assert "UTF-8" in _one_paragraph(caught.value, "monitor.grpo.prompt_file")


@pytest.mark.parametrize(
    ("line", "reason"),
    [(b"42", "is a JSON number, not an object"), (b"[1]", "is a JSON array, not an object"),
     (b"null", "is a JSON null, not an object"), (b'"a.png"', "is a JSON string, not an object"),
     ('{"file_name": "1.png", "text": "\xe9t\xe9"}'.encode("latin-1"), "not UTF-8")],
    ids=["number", "list", "null", "string", "latin-1"],
)  # fmt: skip
def test_a_metadata_line_that_is_not_a_utf8_json_object_names_the_line(tmp_path, line, reason):
    from dit_trainer.data.imagefolder import ImageFolderDataset

    (tmp_path / "metadata.jsonl").write_bytes(b'{"file_name": "0.png", "text": "a"}\n' + line + b"\n")
    with pytest.raises(ConfigError) as caught:
        ImageFolderDataset(tmp_path, resolution=16)
    message = _one_paragraph(caught.value, "data.path")
    assert "line 2 of metadata.jsonl" in message and reason in message


@pytest.mark.parametrize(
    ("overrides", "step", "nearest"),
    [(["data.resolution=36"], "2 × 4 = 8", "`data.resolution=32` or `data.resolution=40`"),
     (["data.resolution=33"], "2 × 4 = 8", "`data.resolution=32` or `data.resolution=40`"),
     (["vae=pixel", "data.resolution=34"], "1 × 4 = 4", "`data.resolution=32` or `data.resolution=36`"),
     (["model.patch_size=2", "data.resolution=14"], "2 × 2 = 4", "`data.resolution=12` or `data.resolution=16`")],
)  # fmt: skip
def test_a_resolution_the_vae_and_patches_do_not_divide_is_refused_at_validation(overrides, step, nearest):
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", *overrides])
    message = _one_paragraph(caught.value, "data.resolution")
    assert step in message and nearest in message


def test_a_resolution_is_checked_again_once_the_vae_is_loaded():
    """A VAE named by a hub id that is not on this machine yet has an unknown factor until it loads."""
    from dit_trainer.components.build import build_components

    cfg = compose_config(TINY_SHAPES)
    cfg.data.resolution = 33  # as if validation could not know the VAE's factor
    with pytest.raises(ConfigError) as caught:
        build_components(cfg, torch.device("cpu"), torch.float32)
    assert "2 × 4 = 8" in _one_paragraph(caught.value, "data.resolution")


def test_an_hf_data_folder_with_metadata_that_is_not_utf8_names_the_cause(tmp_path, monkeypatch):
    import datasets

    from dit_trainer.data.hf import HFImageDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # keep ~/.cache clean
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "0.png").write_bytes(_png())
    (tmp_path / "images" / "metadata.jsonl").write_bytes(
        '{"file_name": "0.png", "text": "\xe9t\xe9"}\n'.encode("latin-1")
    )
    with pytest.raises(ConfigError) as caught:
        HFImageDataset(str(tmp_path / "images"), 16)
    assert "caused by UnicodeDecodeError" in _one_paragraph(caught.value, "data.path")


# Run configs, scripts and trackers (issue 17)

SECRET = "sentinel-secret-5f0c2a9e41d7"


@pytest.fixture()
def written_run(tmp_path, tiny_pixart_dir):
    """A run folder as train.py leaves it, written in-process: the resolved config.yaml and one checkpoint whose
    transformer is the tiny PixArt."""
    from dit_trainer.training.run import save_resolved_config

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_pixart_dir, run_dir / "checkpoints" / "checkpoint-1" / "transformer")
    save_resolved_config(compose_config(TINY_SHAPES), run_dir / "config.yaml")
    return run_dir


def _sample(run_dir, out_dir, *args: str) -> int:
    """scripts/sample.py's command line, in-process: one image of one prompt, one sampling step."""
    from dit_trainer.cli import run_cli
    from dit_trainer.config import SampleConfig
    from dit_trainer.inference import sample_to_folder

    argv = [str(run_dir), f"out_dir={out_dir}", f"checkpoint={run_dir / 'checkpoints' / 'checkpoint-1'}",
            "prompts=[a red circle]", "images_per_prompt=1", "steps=1", *args]  # fmt: skip
    return run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py")


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

    assert _sample(written_run, tmp_path / "out") == 2
    printed = capsys.readouterr()
    assert "`logger.run_name`" in printed.err and SECRET not in printed.out + printed.err
    assert not imported.exists() and not (tmp_path / "out").exists()


def test_a_run_whose_weights_are_a_pickle_is_refused(written_run):
    """dit-trainer writes weights as safetensors only; a pickled .bin in a run folder is not unpickled."""
    from diffusers import PixArtTransformer2DModel

    from dit_trainer.inference import load_run

    checkpoint = written_run / "checkpoints" / "checkpoint-1"
    weights = checkpoint / "transformer"
    PixArtTransformer2DModel.from_pretrained(weights).save_pretrained(weights, safe_serialization=False)
    (weights / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ConfigError) as caught:
        load_run(written_run, str(checkpoint), device="cpu")
    message = str(caught.value)
    assert "`checkpoint`" in message and "safetensors" in message and "\n" not in message


def test_sampling_into_a_folder_with_earlier_samples_is_refused_and_touches_nothing(written_run, tmp_path, capsys):
    out_dir = tmp_path / "samples"
    out_dir.mkdir()
    (out_dir / "00000.png").write_bytes(b"an earlier image")
    (out_dir / "notes.txt").write_text("mine")
    before = _digest(out_dir)
    assert _sample(written_run, out_dir) == 2
    error = capsys.readouterr().err
    assert "`out_dir`" in error and str(out_dir) in error and "00000.png" in error and "To fix it" in error
    assert "Traceback" not in error and _digest(out_dir) == before

    fresh = tmp_path / "fresh"  # the same command into a new folder writes the images
    assert _sample(written_run, fresh) == 0
    assert sorted(p.name for p in fresh.iterdir()) == ["00000.png", "index.jsonl"]
