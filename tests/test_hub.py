"""Loading by hub id or local path (``hub.py``): a model that is not there is named with its key and a fix that fits
what was given. A hub id gets the download advice; a path (a missing folder, a file, a folder without the model) gets
the folder's own problem, never a `huggingface-cli download /a/path` that cannot work."""

from pathlib import Path

import pytest
from diffusers import AutoencoderKL

from dit_trainer.errors import ModelLoadError
from dit_trainer.hub import load_pretrained, looks_like_a_path, require_offline_copy


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(
    ("name", "is_path"),
    [("org/model", False), ("model", False), ("/models/vae", True), ("./vae", True), ("../vae", True),
     ("~/vae", True), ("models/org/vae", True)],
)  # fmt: skip
def test_hub_ids_and_paths_are_told_apart(name, is_path):
    assert looks_like_a_path(name) is is_path


@pytest.mark.parametrize("name", ["/no/such/folder", "./no_such_folder", "a/b/no_such_folder"])
def test_a_missing_folder_is_named_as_a_folder_with_its_absolute_path(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as caught:
        require_offline_copy(name, "vae.pretrained")
    message = str(caught.value)
    assert f"`vae.pretrained={name}` (a local path)" in message
    assert f"there is no folder at {Path(name).absolute()}" in message
    assert "huggingface-cli download ID" in message and f"huggingface-cli download {name}" not in message


def test_a_file_is_refused_as_not_a_model_s_folder(tmp_path):
    weights = tmp_path / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="it is a file, not a model's folder"):
        require_offline_copy(str(weights), "model.pretrained")


def test_a_folder_without_the_model_says_what_its_loader_missed(tmp_path):
    with pytest.raises(ModelLoadError) as caught:
        load_pretrained(AutoencoderKL.from_pretrained, str(tmp_path), "vae.pretrained")
    message = str(caught.value)
    assert f"`vae.pretrained={tmp_path}` (a local path)" in message and "config.json" in message
    assert ".." not in message.replace(str(tmp_path), "")  # the loader's sentence ends once


def test_a_hub_id_missing_offline_gets_the_download_advice():
    with pytest.raises(ModelLoadError) as caught:
        require_offline_copy("org/no-such-model-for-this-test", "conditioner.pretrained")
    message = str(caught.value)
    assert "with HF_HUB_OFFLINE=1" in message and "neither a local folder nor in the hub cache" in message
    assert "huggingface-cli download org/no-such-model-for-this-test --local-dir DIR" in message
    assert "`conditioner.pretrained=DIR`" in message


def test_a_pipeline_folder_without_its_subfolder_is_told_which_subfolder_to_set(tmp_path):
    """It was answered with huggingface_hub's "Repo id must be in the form 'repo_name'...": the folder is no repo
    id, and the fix (the part's sub-folder) was never said."""
    pipeline = tmp_path / "pipeline"
    AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=4).save_pretrained(pipeline / "vae")
    (pipeline / "model_index.json").write_text('{"_class_name": "PixArtAlphaPipeline", "vae": ["diffusers", "x"]}')
    with pytest.raises(ModelLoadError, match=r"a diffusers pipeline's folder .* set `vae.subfolder=vae`"):
        load_pretrained(AutoencoderKL.from_pretrained, str(pipeline), "vae.pretrained")
    with pytest.raises(ModelLoadError, match=r"it has no sub-folder `decoder` \(`vae.subfolder`\)"):
        load_pretrained(AutoencoderKL.from_pretrained, str(pipeline), "vae.pretrained", subfolder="decoder")
    assert isinstance(load_pretrained(AutoencoderKL.from_pretrained, str(pipeline), "", subfolder="vae"), AutoencoderKL)


def test_a_models_weights_fingerprint_changes_with_its_weights_not_with_a_copy(tmp_path, tiny_transformer):
    """What a LoRA checkpoint records of its base: the same weights (re-saved, or copied elsewhere) give the same
    fingerprint, weights of the same shapes drawn otherwise another, sharded files count whole, and a model not on
    this machine has none."""
    from dit_trainer.hub import weights_fingerprint

    def saved(seed: int, folder: str, **options) -> str | None:
        tiny_transformer(seed=seed).transformer.save_pretrained(tmp_path / folder / "transformer", **options)
        return weights_fingerprint(str(tmp_path / folder), "transformer", None)

    first = saved(0, "a")
    assert first is not None and saved(0, "a") == first == saved(0, "copy")
    assert saved(1, "a") not in (None, first)
    sharded = saved(0, "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded" / "transformer").glob("*.safetensors"))) > 1
    assert sharded is not None and saved(1, "sharded", max_shard_size="20KB") != sharded
    assert weights_fingerprint(str(tmp_path / "absent"), None, None) is None
    assert weights_fingerprint("nobody/no-such-model", None, None) is None
