"""The embedded shapes data set and its judge (``data/sources/shapes.py``)."""

import torch

from dit_trainer.data.sources.shapes import (
    CAPTIONS,
    COLORS,
    SHAPES,
    ShapesDataset,
    alignment_components,
    score_alignment,
    shape_margins,
)


def _batch(dataset: ShapesDataset, count: int) -> tuple[torch.Tensor, list[str]]:
    items = [dataset[i] for i in range(count)]
    return torch.stack([(item["image"] + 1) / 2 for item in items]), [item["caption"] for item in items]


def test_items_are_deterministic_per_index_and_seed():
    a, b, other = ShapesDataset(100, seed=3), ShapesDataset(100, seed=3), ShapesDataset(100, seed=4)
    assert torch.equal(a[17]["image"], b[17]["image"])
    assert not torch.equal(a[17]["image"], other[17]["image"])
    assert a[17]["image"].shape == (3, 32, 32)
    assert a[17]["image"].min() >= -1 and a[17]["image"].max() <= 1


def test_every_caption_is_equally_frequent_on_a_grey_background():
    dataset = ShapesDataset(len(CAPTIONS) * 5)
    captions = [dataset[i]["caption"] for i in range(len(dataset))]
    assert sorted(set(captions)) == sorted(CAPTIONS)
    assert all(captions.count(c) == 5 for c in CAPTIONS)
    for index in range(len(dataset)):
        pixels = ((dataset[index]["image"] + 1) * 127.5).round()
        assert pixels.eq(128).all(dim=0).float().mean() > 0.5  # a shape covers less than half of the image


def test_score_alignment_recognises_true_captions_and_rejects_wrong_ones():
    images, captions = _batch(ShapesDataset(240, seed=11), 240)
    assert score_alignment(images, captions).mean() >= 0.95
    colors, shapes = list(COLORS), list(SHAPES)
    wrong = []
    for caption in captions:
        color, shape = caption.removeprefix("a ").split(" ")
        wrong.append(f"a {colors[(colors.index(color) + 3) % 8]} {shapes[(shapes.index(shape) + 1) % 3]}")
    scores = score_alignment(images, wrong)
    assert scores.shape == (240,)
    assert scores.mean() <= 0.2


def test_alignment_is_zero_for_a_blank_image_and_robust_to_mild_noise():
    images, captions = _batch(ShapesDataset(48, seed=5), 48)
    blank = torch.full_like(images, 128 / 255)
    assert score_alignment(blank, captions).sum() == 0
    torch.manual_seed(0)
    color_ok, shape_ok = alignment_components((images + 0.05 * torch.randn_like(images)).clamp(0, 1), captions)
    assert color_ok.mean() >= 0.95 and shape_ok.mean() >= 0.9


def test_the_shape_margin_is_positive_only_where_the_judge_reads_the_captioned_shape_and_ranks_cleaner_shapes():
    images, captions = _batch(ShapesDataset(96, seed=9), 96)
    shapes = list(SHAPES)
    wrong = [f"{c.rsplit(' ', 1)[0]} {shapes[(shapes.index(c.rsplit(' ', 1)[1]) + 1) % 3]}" for c in captions]
    torch.manual_seed(0)
    noisy = (images + 0.25 * torch.randn_like(images)).clamp(0, 1)
    for batch, asked in [(images, captions), (images, wrong), (noisy, captions)]:
        margins = shape_margins(batch, asked)
        assert margins.shape == (96,) and margins.abs().max() <= 1
        assert torch.equal(margins > 0, alignment_components(batch, asked)[1] > 0)
    assert (shape_margins(images, captions) > 0).all() and (shape_margins(images, wrong) < 0).all()
    assert shape_margins(noisy, captions).mean() < shape_margins(images, captions).mean()  # rougher, less clear
    assert torch.equal(shape_margins(torch.full_like(images, 128 / 255), captions), torch.full((96,), -1.0))
