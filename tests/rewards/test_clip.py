"""CLIP score (``rewards/clip.py``): the cosine similarity of CLIP's own projections, and a missing model named with
its config key."""

import pytest
import torch

from dit_trainer.rewards.clip import load_clip_score

CPU = torch.device("cpu")


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


def test_a_missing_clip_model_names_the_config_key(tmp_path):
    from dit_trainer.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="reward.clip_model"):
        load_clip_score(str(tmp_path / "no-clip-here"), CPU)
