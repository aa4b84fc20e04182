"""LoRA fine-tuning (``components/lora.py``): only the adapters train, the base stays bit-identical, and LoRA needs a
pretrained base and target modules it has."""

import pytest
import torch
from torch.utils.data import DataLoader

from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.diffusion.loss import diffusion_loss
from dit_trainer.errors import ConfigError
from dit_trainer.training.optim import build_optimizer

from ..conftest import TINY_SHAPES, components_of, compose_config, lora_overrides, tiny_batch

CPU = torch.device("cpu")


def test_lora_with_gradient_checkpointing_trains_adapters_and_leaves_the_base_bit_identical(tiny_pixart_dir):
    cfg = compose_config([*TINY_SHAPES, *lora_overrides(tiny_pixart_dir)])
    torch.manual_seed(0)
    parts = components_of(cfg)
    transformer = parts.dit.transformer
    assert transformer.is_gradient_checkpointing
    named = dict(transformer.named_parameters())
    trainable = {name for name, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in name or "modules_to_save" in name for name in trainable)
    assert any("caption_projection" in name for name in trainable)
    before = {name: p.detach().clone() for name, p in named.items()}

    optimizer = build_optimizer(cfg.optim, parts.dit)
    batch = next(iter(DataLoader(ShapesDataset(16, seed=1), batch_size=16)))
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):  # two steps: LoRA's B starts at zero, so A first moves at the second step
        loss = diffusion_loss(batch, parts.dit, parts.vae, parts.text_encoder, parts.schedule, generator)[0].mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for name, p in named.items():
        if name in trainable:
            assert not torch.equal(p, before[name]), f"{name} did not train"
        else:
            assert torch.equal(p, before[name]), f"frozen {name} changed"


def test_lora_needs_a_pretrained_base_and_known_target_modules(tiny_pixart_dir):
    with pytest.raises(ConfigError, match="`model.pretrained`"):
        compose_config([*TINY_SHAPES, "lora.enabled=true"])
    cfg = compose_config([*TINY_SHAPES, *lora_overrides(tiny_pixart_dir), "lora.target_modules=[no_such_layer]"])
    with pytest.raises(ConfigError, match="`lora.target_modules`"):
        components_of(cfg)


def test_switching_the_adapters_off_and_on_keeps_a_frozen_adapter_frozen(tiny_transformer):
    """The KL reference of the online methods computes with the adapters off; turning them back on (peft sets every
    adapter trainable) must not wake the ones frozen on purpose: Qwen-Image's dead ends, whose EMA and optimizer
    leave them out."""
    from dit_trainer.components.families.qwen_image import QWEN_IMAGE
    from dit_trainer.components.lora import adapters_disabled, apply_lora
    from dit_trainer.config import LoRAConfig

    dit = tiny_transformer("qwen_image", condition_dim=12, num_layers=2)
    apply_lora(dit.transformer, LoRAConfig(enabled=True, rank=2), QWEN_IMAGE.lora_targets)
    dit.freeze_dead_ends()
    trained = [name for name, parameter in dit.named_parameters() if parameter.requires_grad]
    assert not any("transformer_blocks.1.txt_mlp" in name for name in trained)
    assert any("transformer_blocks.0.txt_mlp" in name for name in trained)
    with adapters_disabled(dit.transformer):
        assert not any(parameter.requires_grad for parameter in dit.parameters())
    assert [name for name, parameter in dit.named_parameters() if parameter.requires_grad] == trained


def test_with_the_adapters_off_the_modules_trained_in_full_compute_as_the_base_s(tiny_transformer):
    """The KL reference is the base model: a module of ``lora.train_modules`` (trained in full, beside the adapters)
    must compute with its starting weights there, not with the ones training moved."""
    from dit_trainer.components.lora import adapters_disabled, apply_lora
    from dit_trainer.config import LoRAConfig

    dit = tiny_transformer(condition_dim=12)
    x, t, condition, _ = tiny_batch()
    base = dit.predict(x, t, condition)
    lora = LoRAConfig(enabled=True, rank=2, train_modules=["caption_projection"])
    apply_lora(dit.transformer, lora, ["to_q", "to_k", "to_v"])
    with torch.no_grad():  # what training would do to the trained copy
        for name, parameter in dit.named_parameters():
            if "modules_to_save" in name:
                parameter.add_(0.5)
    assert not torch.allclose(dit.predict(x, t, condition), base)
    with adapters_disabled(dit.transformer):
        torch.testing.assert_close(dit.predict(x, t, condition), base)
    assert any(p.requires_grad for name, p in dit.named_parameters() if "modules_to_save" in name)


def test_a_train_module_that_names_no_module_is_refused(tiny_transformer):
    """peft passes over a ``modules_to_save`` name that matches nothing: a typo would train only the adapters."""
    from dit_trainer.components.lora import apply_lora
    from dit_trainer.config import LoRAConfig

    dit = tiny_transformer(condition_dim=12)
    lora = LoRAConfig(enabled=True, rank=2, train_modules=["caption_projection", "caption_projectoin"])
    with pytest.raises(ConfigError, match=r"lora.train_modules.*'caption_projectoin'.*caption_projection"):
        apply_lora(dit.transformer, lora, ["to_q", "to_k", "to_v"])
