"""The frozen text encoder (``components/conditioners/text_encoder.py``): fixed-length hidden states and masks from
MiniLM, an exact and bounded memo, and a T5 encoder loaded from a pipeline's sub-folders."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertModel, T5EncoderModel

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import ConfigError, ModelLoadError
from tests.conftest import one_paragraph

CPU = torch.device("cpu")


def test_minilm_text_encoder_gives_fixed_length_hidden_states_and_mask(minilm_path):
    encoder = build_text_encoder(ConditionerConfig(pretrained=minilm_path, max_length=8), CPU)
    assert isinstance(encoder.model, BertModel) and encoder.hidden_size == 384
    assert not any(p.requires_grad for p in encoder.parameters())
    embeds, mask, pooled = encoder.encode(["a red circle", ""])
    assert embeds.shape == (2, 8, 384) and mask.shape == (2, 8) and pooled is None
    assert mask[0].sum() > mask[1].sum() >= 1  # [CLS] a red circle [SEP] vs [CLS] [SEP]


def test_a_pooled_vector_is_the_mean_of_the_real_tokens_or_the_models_own_pooler(minilm_path):
    """MiniLM's sentence embedding (what sentence-transformers computes) is the pooled vector SD3- and Flux-style
    families take; padding must not dilute it."""
    mean = build_text_encoder(ConditionerConfig(pretrained=minilm_path, max_length=8, pooling="mean"), CPU)
    assert mean.size == ConditionSize(384, 384)
    embeds, mask, pooled = mean.encode(["a red circle", "a blue square that is large"])
    for row in range(2):
        real = embeds[row][mask[row].bool()]
        torch.testing.assert_close(pooled[row], real.mean(0))
    assert mask[0].sum() < mask[1].sum()  # the first prompt is padded: an unmasked mean would differ
    assert not torch.allclose(pooled[0], embeds[0].mean(0))
    pooler = build_text_encoder(ConditionerConfig(pretrained=minilm_path, max_length=8, pooling="pooler"), CPU)
    tokens = pooler.tokenizer(["a red circle"], padding="max_length", max_length=8, return_tensors="pt")
    torch.testing.assert_close(pooler.encode(["a red circle"]).pooled, pooler.model(**tokens).pooler_output)


def test_memoised_text_encoder_is_exact_and_bounded(minilm_path):
    cfg = ConditionerConfig(pretrained=minilm_path, max_length=8, pooling="mean")
    plain = build_text_encoder(cfg, CPU)
    cfg.memo_size = 2
    memo = build_text_encoder(cfg, CPU)
    prompts = ["a red circle", "a blue square", "a red circle", "a green triangle"]
    for a, b in zip(plain.encode(prompts), memo.encode(prompts)):
        torch.testing.assert_close(a, b)
    assert len(memo._memo) == 2


def test_t5_checkpoint_loads_encoder_only_from_subfolders(tiny_t5_dir):
    cfg = ConditionerConfig(
        pretrained=str(tiny_t5_dir), subfolder="text_encoder", tokenizer_subfolder="tokenizer", max_length=12
    )
    encoder = build_text_encoder(cfg, CPU)
    assert isinstance(encoder.model, T5EncoderModel) and encoder.hidden_size == 32
    embeds, mask, _ = encoder.encode(["a cat"])
    assert embeds.shape == (1, 12, 32) and mask.shape == (1, 12)


def test_the_empty_prompt_is_encoded_once_even_without_a_memo(minilm_path):
    """Caption dropout and CFG ask for it every step: a T5-XXL would run once per step for it."""
    encoder = build_text_encoder(ConditionerConfig(pretrained=minilm_path, max_length=8), CPU)
    first = encoder.encode([""])
    assert encoder.encode([""]) is first and not encoder._memo
    assert all(torch.equal(a, b) for a, b in zip(first[:2], encoder.encode_uncached([""])[:2]))


def test_a_pooler_is_refused_for_an_encoder_that_has_none(tiny_t5_dir):
    cfg = ConditionerConfig(pretrained=str(tiny_t5_dir), subfolder="text_encoder", tokenizer_subfolder="tokenizer",
                            max_length=12, pooling="pooler")  # fmt: skip
    with pytest.raises(ConfigError, match="T5EncoderModel has no pooled output"):
        build_text_encoder(cfg, CPU)


def test_a_folder_of_another_encoder_is_refused_not_loaded_at_random(minilm_path, tiny_t5_dir):
    """MiniLM's folder read as T5 (or T5's as CLIP) loaded none of the encoder's weights: transformers started
    them all at random and the run trained on noise features, exit 0. Now one paragraph names the folder, the class
    asked for and what the folder holds."""
    with pytest.raises(ModelLoadError) as caught:
        build_text_encoder(ConditionerConfig(pretrained=minilm_path, kind="t5", max_length=8), CPU)
    message = one_paragraph(caught.value, "conditioner.pretrained")
    assert "of a T5EncoderModel" in message and "says BertModel" in message and "`conditioner.kind`" in message
    t5 = ConditionerConfig(pretrained=str(tiny_t5_dir), kind="clip", subfolder="text_encoder",
                           tokenizer_subfolder="tokenizer", max_length=8)  # fmt: skip
    with pytest.raises(ModelLoadError, match="subfolder `text_encoder`.*of a CLIPTextModel.*says T5EncoderModel"):
        build_text_encoder(t5, CPU)


def test_a_few_weights_missing_from_an_encoder_are_named_in_a_warning(tiny_t5_dir, tmp_path, caplog):
    folder = tmp_path / "t5"
    shutil.copytree(tiny_t5_dir, folder)
    weights = folder / "text_encoder" / "model.safetensors"
    tensors = load_file(weights)
    dropped = "encoder.final_layer_norm.weight"
    save_file({name: tensor for name, tensor in tensors.items() if name != dropped}, weights, {"format": "pt"})
    cfg = ConditionerConfig(pretrained=str(folder), subfolder="text_encoder", tokenizer_subfolder="tokenizer",
                            max_length=8)  # fmt: skip
    build_text_encoder(cfg, CPU)
    assert f"starts 1 weights at random, as the checkpoint lacks them: {dropped}" in caplog.text
