import pytest
import torch
from torch.utils.data import DataLoader

from dit_trainer.config import RewardConfig
from dit_trainer.data.shapes import COLORS, SHAPES, ShapesDataset
from dit_trainer.errors import ConfigError
from dit_trainer.rewards.base import WeightedReward
from dit_trainer.rewards.build import build_reward
from dit_trainer.rewards.clip import load_clip_score
from dit_trainer.rewards.grpo import group_statistics, reward_metrics
from dit_trainer.rewards.jpeg import JPEGCompressibilityReward
from dit_trainer.rewards.shapes import ShapesAlignmentReward

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shapes_batch() -> tuple[torch.Tensor, list[str]]:
    batch = next(iter(DataLoader(ShapesDataset(48, seed=5), batch_size=48)))
    return (batch["image"] + 1) / 2, list(batch["caption"])


def _mismatched(caption: str) -> str:
    """Another colour and another shape than the caption's."""
    color, shape = caption.removeprefix("a ").split(" ")
    colors, shapes = list(COLORS), list(SHAPES)
    return f"a {colors[(colors.index(color) + 1) % len(colors)]} {shapes[(shapes.index(shape) + 1) % len(shapes)]}"


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory, minilm_path):
    """A randomly initialised CLIP (32 px, 2 layers) with a BERT tokenizer and a CLIP preprocessor config."""
    from transformers import AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel

    root = tmp_path_factory.mktemp("tiny_clip")
    torch.manual_seed(0)
    text = {
        "vocab_size": 30522,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 32,
    }
    vision = {
        "image_size": 32,
        "patch_size": 8,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(root)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(root)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(root)
    return root


def test_shapes_alignment_scores_true_captions_high_and_wrong_ones_low(shapes_batch):
    images, captions = shapes_batch
    reward = ShapesAlignmentReward()
    true_scores = reward(images, captions)
    assert true_scores.shape == (48,) and true_scores.dtype == torch.float32
    assert true_scores.mean() >= 0.95
    assert reward(images, [_mismatched(c) for c in captions]).mean() <= 0.2
    assert ((true_scores >= 0) & (true_scores <= 1)).all()


def test_shapes_margin_is_built_by_name_and_separates_true_captions_from_wrong_ones(shapes_batch):
    images, captions = shapes_batch
    margin = build_reward(RewardConfig(weights={"shapes_margin": 1.0}), CPU)
    true_margins = margin(images, captions)
    assert true_margins.shape == (48,) and true_margins.dtype == torch.float32
    assert (true_margins > 0).all() and (margin(images, [_mismatched(c) for c in captions]) < 0).all()


def test_jpeg_compressibility_prefers_simple_images():
    flat = torch.full((2, 3, 32, 32), 0.5)
    noise = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    reward = JPEGCompressibilityReward(quality=95)
    scores = reward(torch.cat([flat, noise]), ["a", "b", "c", "d"])
    assert scores.shape == (4,) and (scores <= 0).all()
    assert scores[:2].min() > scores[2:].max()


def test_clip_score_is_a_cosine_similarity_from_the_model_s_own_projections(tiny_clip_dir, shapes_batch):
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

    reward = load_clip_score(str(tiny_clip_dir), CPU)
    assert not any(p.requires_grad for p in reward.model.parameters()) and not reward.model.training
    images, captions = shapes_batch[0][:4], shapes_batch[1][:4]
    scores = reward(images, captions)
    assert scores.shape == (4,) and ((scores >= -1) & (scores <= 1)).all()

    # The same score through transformers' own processor and CLIPModel.forward (logits = scale * cosine).
    model, tokenizer = CLIPModel.from_pretrained(tiny_clip_dir).eval(), AutoTokenizer.from_pretrained(tiny_clip_dir)
    pixels = CLIPImageProcessor.from_pretrained(tiny_clip_dir)(
        images=list(images), return_tensors="pt", do_rescale=False
    )
    tokens = tokenizer(captions, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**tokens, pixel_values=pixels.pixel_values).logits_per_image
    expected = logits.diagonal() / model.logit_scale.exp()
    torch.testing.assert_close(scores, expected, atol=2e-3, rtol=0)


def test_weighted_reward_sums_its_terms_and_keeps_each(shapes_batch):
    images, captions = shapes_batch
    reward = build_reward(RewardConfig(weights={"shapes_alignment": 2.0, "jpeg_compressibility": 0.1}), CPU)
    scores = reward.scores(images, captions)
    assert set(scores) == {"shapes_alignment", "jpeg_compressibility"}
    expected = 2.0 * ShapesAlignmentReward()(images, captions) + 0.1 * JPEGCompressibilityReward()(images, captions)
    torch.testing.assert_close(reward(images, captions), expected)


def test_rewards_refuse_inputs_that_break_the_protocol():
    reward = WeightedReward({"shapes_alignment": (1.0, ShapesAlignmentReward())})
    with pytest.raises(ValueError, match="one prompt per image"):
        reward(torch.rand(2, 3, 8, 8), ["only one"])
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        reward(torch.rand(2, 8, 8), ["a", "b"])


@pytest.mark.parametrize(
    ("weights", "key"),
    [
        ({"aesthetic": 1.0}, "reward.weights.aesthetic"),
        ({}, "reward.weights"),
        ({"clip_score": float("nan")}, "reward.weights.clip_score"),
    ],
)
def test_bad_reward_configs_name_the_key(weights, key):
    with pytest.raises(ConfigError) as caught:
        build_reward(RewardConfig(weights=weights), CPU)
    assert f"`{key}`" in str(caught.value)


def test_a_missing_clip_model_names_the_config_key(tmp_path):
    from dit_trainer.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="reward.clip_model"):
        load_clip_score(str(tmp_path / "no-clip-here"), CPU)


def test_group_statistics_match_a_hand_computed_example():
    # Three prompts x G=4: a split group, a zero-std group, a 0.2/0.8 group.
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.8, 0.8])
    stats = group_statistics(rewards, group_size=4, eps=1e-4)
    torch.testing.assert_close(stats.mean, torch.tensor([0.5, 0.5, 0.5]))
    torch.testing.assert_close(stats.std, torch.tensor([0.5, 0.0, 0.3]))
    expected = torch.tensor([0.5, -0.5, 0.5, -0.5]) / 0.5001
    torch.testing.assert_close(stats.advantages[:4], expected)
    assert torch.equal(stats.advantages[4:8], torch.zeros(4))  # no signal from a group that agrees
    torch.testing.assert_close(stats.advantages[8:], torch.tensor([-0.3, -0.3, 0.3, 0.3]) / 0.3001)
    global_std = rewards.std(correction=0)  # sqrt(mean((r - 0.5)^2)) = sqrt((4 * .25 + 4 * .09) / 12)
    torch.testing.assert_close(global_std, torch.tensor((1.36 / 12) ** 0.5))
    torch.testing.assert_close(
        stats.advantages_global_std[:4], torch.tensor([0.5, -0.5, 0.5, -0.5]) / (global_std + 1e-4)
    )
    assert stats.zero_std_fraction == pytest.approx(1 / 3)


def test_group_statistics_refuse_a_ragged_batch():
    with pytest.raises(ValueError, match="P x 4"):
        group_statistics(torch.zeros(10), group_size=4)


def test_reward_metrics_are_the_keys_the_monitor_logs():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    metrics = reward_metrics({"shapes_alignment": rewards}, rewards, group_size=2)
    assert metrics["reward/mean"] == pytest.approx(0.5) and metrics["reward/shapes_alignment"] == pytest.approx(0.5)
    assert metrics["grpo/zero_std_frac"] == pytest.approx(0.5)
    assert metrics["grpo/adv_abs_mean"] == pytest.approx(0.5 * 0.5 / 0.5001)
    assert {"reward/std", "grpo/adv_abs_mean_global_std", "grpo/group_std_mean"} <= set(metrics)
