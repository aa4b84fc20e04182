"""The loader measure of ``scripts/benchmark.py --loader`` (``dit_trainer/apps/loader_benchmark.py``): the run's own
training loader, read without a model, in images per second."""

from dit_trainer.apps.loader_benchmark import loader_images_per_second
from dit_trainer.components.geometry import configured_buckets
from tests.conftest import TINY_SHAPES, compose_config
from tests.data.files import captioned_folder


def test_the_loader_measure_reads_the_runs_training_batches(tmp_path):
    captioned_folder(tmp_path / "images", 40)
    cfg = compose_config([*TINY_SHAPES, "data=imagefolder", f"data.path={tmp_path / 'images'}", "data.resolution=32",
                          "trainer.batch_size=4", "data.buckets=[[32,32],[24,40]]"])  # fmt: skip
    buckets = configured_buckets(cfg.model, cfg.vae, cfg.data)
    assert loader_images_per_second(cfg.data, cfg.trainer, buckets, workers=0, batches=5) > 0
