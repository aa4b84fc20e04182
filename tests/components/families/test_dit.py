"""The class-conditional DiT family (``components/families/dit.py``): a tiny DiT saved by path loads and predicts,
its label dropout left to the trainer, and a class count that does not fit the configured classes is refused."""

import pytest
import torch
from diffusers.models.embeddings import LabelEmbedding

from dit_trainer.components.dit import build_dit
from dit_trainer.config import ModelConfig
from dit_trainer.errors import ConfigError


def test_a_tiny_dit_saved_by_path_loads_predicts_and_keeps_label_dropout_to_the_trainer(tmp_path, tiny_transformer):
    tiny_transformer("dit", num_layers=1, condition_dim=10).transformer.save_pretrained(tmp_path / "dit")
    dit = build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, 10)
    labels = torch.tensor([3, 10])  # a class and the null class
    assert dit(torch.randn(2, 4, 8, 8), torch.tensor([500]), labels).shape == (2, 4, 8, 8)
    tables = [module for module in dit.transformer.modules() if isinstance(module, LabelEmbedding)]
    assert tables and all(table.dropout_prob == 0 and table.embedding_table.num_embeddings == 11 for table in tables)
    with pytest.raises(ConfigError, match=r"`model\.pretrained`.*10 classes while `text_encoder\.classes` lists 12"):
        build_dit(ModelConfig(family="dit", pretrained=str(tmp_path / "dit")), 4, 8, 12)
