"""Dataset mixtures (``data/mixture.py``): a mixture trains each source by its weight, seeded and resumable, and
skipped files are counted per source."""

from itertools import islice

from dit_trainer.training.batches import resumable_batches
from dit_trainer.training.run import build_trainer

from ..conftest import compose_config
from .files import mixture_overrides


def test_a_mixture_trains_by_weight_resumes_exactly_and_counts_skips_per_source(tmp_path):
    trainer = build_trainer(compose_config(mixture_overrides(tmp_path, "data.cache_latents=false")), tmp_path / "run")
    batches = list(islice(trainer.batches(), 40))  # two epochs of 20 batches
    captions = [caption for batch in batches for caption in batch["caption"]]
    photos = sum(caption.startswith("photo") for caption in captions)
    assert photos == 40  # a quarter of each epoch's 80 items
    resumed = list(islice(resumable_batches(trainer.dataloader, trainer.accelerator, 23), 17))
    assert [batch["caption"] for batch in resumed] == [batch["caption"] for batch in batches[23:]]
    for batch in batches:
        trainer.bad_files.add(batch)
    counts = trainer.bad_files.check()
    assert counts["data/skipped/photos"] == counts["data/skipped"] > 0
    assert counts["data/skipped/imagefolder0"] == 0
