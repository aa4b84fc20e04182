"""``trainer.fused_qkv`` (``components/fused_qkv.py``): one matmul per attention's projections that computes what
the three did, with the same parameters, names and gradients (so checkpoints and exports are the unfused model's),
refused where the fused matmul would bypass what trains or is watched, and for a family whose attention diffusers'
fused processor does not take."""

import pytest
import torch

from dit_trainer.components.fused_qkv import FusedProjection, fuse_qkv
from dit_trainer.errors import ConfigError
from dit_trainer.run_config import validate

from ..conftest import TINY_SHAPES, components_of, compose_config, one_paragraph
from .test_meta import FAMILIES, _inputs


@pytest.mark.parametrize("family", ["pixart_alpha", "dit"])
def test_the_fused_model_computes_what_the_unfused_one_does_with_the_same_parameters(family, tiny_transformer):
    width, pooled = FAMILIES[family]
    unfused, fused = (tiny_transformer(family, condition_dim=width, pooled_dim=pooled) for _ in range(2))
    names, keys = [name for name, _ in fused.named_parameters()], list(fused.state_dict())
    assert fuse_qkv(fused) == (4 if family == "pixart_alpha" else 2)  # PixArt: self- and cross-attention per block
    assert [name for name, _ in fused.named_parameters()] == names and list(fused.state_dict()) == keys
    assert any(isinstance(module, FusedProjection) for module in fused.transformer.modules())
    inputs = _inputs(family)
    outputs = [model(*inputs) for model in (unfused, fused)]
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    for output in outputs:
        output.pow(2).mean().backward()
    for (name, mine), (_, theirs) in zip(fused.named_parameters(), unfused.named_parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["lora.enabled=true", "model.pretrained=x"], "`lora.enabled` is set"),
        (["privacy.enabled=true"], "Opacus"),
        (["precision.fp8=true", "precision.fp8_emulate=true"], "FP8"),
    ],
)
def test_fusing_what_another_switch_wraps_is_refused(overrides, says):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config([*TINY_SHAPES, "trainer.fused_qkv=true", *overrides]))
    assert says in one_paragraph(caught.value, "trainer.fused_qkv")


def test_a_family_whose_attention_the_fused_processor_does_not_take_is_refused():
    cfg = compose_config(["+experiment=shapes_sd3", "model.num_layers=1", "trainer.fused_qkv=true"])
    with pytest.raises(ConfigError) as caught:
        components_of(cfg)
    assert "JointAttnProcessor2_0" in one_paragraph(caught.value, "trainer.fused_qkv")
