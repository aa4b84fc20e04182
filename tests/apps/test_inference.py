"""Loading a trained run back for sampling (``inference.py``): weights are read from safetensors only, and earlier
samples are never overwritten."""

import pytest

from dit_trainer.errors import ConfigError
from tests.conftest import digest, sample_in_process


def test_a_run_whose_weights_are_a_pickle_is_refused(written_run):
    """dit-trainer writes weights as safetensors only; a pickled .bin in a run folder is not unpickled."""
    from diffusers import PixArtTransformer2DModel

    from dit_trainer.apps.inference import load_run

    checkpoint = written_run / "checkpoints" / "checkpoint-1"
    weights = checkpoint / "transformer"
    PixArtTransformer2DModel.from_pretrained(weights).save_pretrained(weights, safe_serialization=False)
    (weights / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ConfigError) as caught:
        load_run(written_run, str(checkpoint), device="cpu")
    message = str(caught.value)
    assert "`checkpoint`" in message and "safetensors" in message and "\n" not in message


def test_a_lora_checkpoint_given_for_a_run_that_trained_the_whole_dit_is_named_as_another_runs(written_run):
    """It was refused as a weights folder with no .safetensors file in it, a folder that does not exist."""
    from dit_trainer.apps.inference import load_run

    checkpoint = written_run / "checkpoints" / "checkpoint-1"
    (checkpoint / "transformer").rename(checkpoint / "transformer_lora")  # what a LoRA run's checkpoint holds
    with pytest.raises(ConfigError) as caught:
        load_run(written_run, str(checkpoint), device="cpu")
    message = str(caught.value)
    assert "it holds LoRA adapters (`transformer_lora/`), and the run whose config is read trained the whole DiT" in (
        message
    )
    assert "another run's checkpoint" in message and "\n" not in message


def test_sampling_into_a_folder_with_earlier_samples_is_refused_and_touches_nothing(written_run, tmp_path, capsys):
    out_dir = tmp_path / "samples"
    out_dir.mkdir()
    (out_dir / "00000.png").write_bytes(b"an earlier image")
    (out_dir / "notes.txt").write_text("mine")
    before = digest(out_dir)
    assert sample_in_process(written_run, out_dir) == 2
    error = capsys.readouterr().err
    assert "`out_dir`" in error and str(out_dir) in error and "00000.png" in error and "To fix it" in error
    assert "(with no index.jsonl: what a sample.py that was stopped leaves)" in error  # it wrote its images only
    assert "Traceback" not in error and digest(out_dir) == before

    fresh = tmp_path / "fresh"  # the same command into a new folder writes the images
    assert sample_in_process(written_run, fresh) == 0
    assert sorted(p.name for p in fresh.iterdir()) == ["00000.png", "index.jsonl"]


def test_image_j_of_every_prompt_has_seed_plus_j_whatever_prompts_stand_beside_it(written_run, tmp_path):
    """As in evaluate.py and the sample grids: a prompt's images do not move when prompts are added or reordered."""
    import json

    import numpy as np
    from PIL import Image

    both, alone = tmp_path / "both", tmp_path / "alone"
    assert sample_in_process(written_run, both, "prompts=[a red circle,a blue square]", "images_per_prompt=2",
                             "seed=5") == 0  # fmt: skip
    rows = [json.loads(line) for line in (both / "index.jsonl").read_text().splitlines()]
    assert [(row["prompt"], row["seed"]) for row in rows] == [
        ("a red circle", 5), ("a red circle", 6), ("a blue square", 5), ("a blue square", 6)
    ]  # fmt: skip
    again = tmp_path / "again"  # a prompt listed twice: more images of it, not copies
    assert sample_in_process(written_run, again, "prompts=[a red circle,a red circle]", "images_per_prompt=2") == 0
    rows = [json.loads(line) for line in (again / "index.jsonl").read_text().splitlines()]
    assert [row["seed"] for row in rows] == [0, 1, 2, 3]
    assert sample_in_process(written_run, alone, "prompts=[a blue square]", "images_per_prompt=1", "seed=5") == 0
    pixels = [np.asarray(Image.open(path), dtype=np.int16) for path in (alone / "00000.png", both / "00002.png")]
    assert np.abs(pixels[0] - pixels[1]).max() <= 1  # the same noise; a batch of 4 may round one level otherwise


def test_weights_damaged_in_a_checkpoint_without_a_manifest_are_one_paragraph(written_run, tmp_path, capsys):
    """A checkpoint written before manifests is read as it is: its cut-short weights are named, exit 2."""
    weights = written_run / "checkpoints" / "checkpoint-1" / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert sample_in_process(written_run, tmp_path / "samples") == 2
    error = capsys.readouterr().err
    assert f"Could not read the weights in {weights.parent}" in error and "they are damaged or were cut short" in error
    assert "`checkpoint=checkpoint-N`, one of the folders beside checkpoint-1" in error
    assert "Traceback" not in error


def test_a_file_another_sampling_wrote_meanwhile_is_refused_in_one_paragraph(
    written_run, tmp_path, monkeypatch, capsys
):
    """Two commands given one new folder: the one that loses the race names the file, exit 2, and keeps it."""
    from dit_trainer.apps import inference

    out_dir, load_run = tmp_path / "samples", inference.load_run

    def meanwhile(*args, **kwargs):
        out_dir.mkdir()
        (out_dir / "index.jsonl").write_text("the other command's\n")
        return load_run(*args, **kwargs)

    monkeypatch.setattr(inference, "load_run", meanwhile)
    assert sample_in_process(written_run, out_dir) == 2
    error = capsys.readouterr().err
    assert "holds index.jsonl, which another command wrote there while this one ran" in error
    assert "Traceback" not in error and (out_dir / "index.jsonl").read_text() == "the other command's\n"
