"""The class-conditional DiT family (``components/families/dit.py``): a tiny DiT saved by path loads and predicts,
its label dropout left to the trainer, and a class count that does not fit the configured classes is refused."""

import pytest
import torch
from diffusers import DiTTransformer2DModel
from diffusers.models.embeddings import LabelEmbedding

from dit_trainer.components.dit import build_dit
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.errors import ConfigError


def test_a_tiny_dit_saved_by_path_loads_predicts_and_keeps_label_dropout_to_the_trainer(tmp_path, tiny_transformer):
    tiny_transformer("dit", num_layers=1, condition_dim=10).transformer.save_pretrained(tmp_path / "dit")
    dit = build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, ConditionSize(10))
    labels = Condition(torch.tensor([3, 10]), torch.ones(2, 1))  # a class and the null class
    assert dit(torch.randn(2, 4, 8, 8), torch.tensor([500]), labels).shape == (2, 4, 8, 8)
    tables = [module for module in dit.transformer.modules() if isinstance(module, LabelEmbedding)]
    assert tables and all(table.dropout_prob == 0 and table.embedding_table.num_embeddings == 11 for table in tables)
    with pytest.raises(ConfigError, match=r"`model\.pretrained`.*10 classes while `conditioner\.classes` lists 12"):
        build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, ConditionSize(12))


def test_dit_xl_2_has_the_papers_parameter_count():
    """One timestep-and-label embedder for all 28 blocks, as facebookresearch/DiT: 675,129,632 parameters counting
    the fixed sin-cos position table that repository keeps as a frozen parameter (diffusers: a buffer). diffusers'
    layout, an embedder per block, has 749,826,464 trained parameters."""
    xl = ModelConfig(family="dit", num_layers=28, num_attention_heads=16, attention_head_dim=72, patch_size=2,
                     learned_sigma=True)  # fmt: skip
    with torch.device("meta"):
        transformer = build_dit(xl, 4, 32, ConditionSize(1000)).transformer
    trained = sum(parameter.numel() for parameter in transformer.parameters())
    assert trained == 674_834_720 and trained + transformer.pos_embed.pos_embed.numel() == 675_129_632


def test_the_shared_embedder_is_saved_in_diffusers_layout_and_shared_again_when_loaded(tmp_path):
    cfg = ModelConfig(family="dit", num_layers=3, num_attention_heads=2, attention_head_dim=8)
    shared = build_dit(cfg, 4, 8, ConditionSize(10)).transformer
    blocks = shared.transformer_blocks
    assert all(block.norm1.emb is blocks[0].norm1.emb for block in blocks)
    shared.save_pretrained(tmp_path / "dit")  # safetensors refuses tensors that share memory: each block gets a copy
    plain = DiTTransformer2DModel.from_pretrained(tmp_path / "dit")  # what DiTPipeline loads
    loaded = build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, ConditionSize(10)).transformer
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in shared.parameters())
    assert sum(p.numel() for p in plain.parameters()) > sum(p.numel() for p in shared.parameters())
    x, t, labels = torch.randn(2, 4, 8, 8), torch.tensor([3, 500]), torch.tensor([1, 10])
    outputs = [model(x, timestep=t, class_labels=labels).sample for model in (shared, plain, loaded)]
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


def test_embedders_that_differ_stay_unshared_and_are_not_loaded_into_a_shared_one(tmp_path):
    """A DiT trained in diffusers' layout keeps its layout when loaded; loading its weights into a shared embedder
    (a resume of such a run) would silently keep only the last block's, and is refused."""
    unshared = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=3,
                                     sample_size=8, patch_size=2, num_embeds_ada_norm=10)  # fmt: skip
    unshared.save_pretrained(tmp_path / "dit")
    loaded = build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, ConditionSize(10)).transformer
    assert loaded.transformer_blocks[1].norm1.emb is not loaded.transformer_blocks[0].norm1.emb
    shared = build_dit(
        ModelConfig(family="dit", num_layers=3, num_attention_heads=2, attention_head_dim=8), 4, 8, ConditionSize(10)
    )
    with pytest.raises(ConfigError, match=r"gives? each block its own timestep and label embedder"):
        shared.transformer.load_state_dict(unshared.state_dict())
