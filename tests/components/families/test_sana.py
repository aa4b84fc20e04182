"""The Sana family (``components/families/sana.py``) and its conditioner (``components/conditioners/sana.py``) on a
tiny random Sana pipeline folder: the conditioner gives exactly what ``SanaPipeline.encode_prompt`` gives, the
transformer is called as the pipeline calls it, and the config rules name their keys."""

import inspect

import pytest
import torch
import yaml
from diffusers import SanaPipeline, SanaTransformer2DModel

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import build_dit, enable_gradient_checkpointing
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, ModelConfig
from dit_trainer.errors import ConfigError

from ...conftest import CONFIG_DIR, TINY_SHAPES, compose_config, one_paragraph
from ...tiny_sana import LATENT_CHANNELS, TEXT_DIM, TRANSFORMER, sana_overrides, write_sana_folder

SANA_INSTRUCTION = yaml.safe_load((CONFIG_DIR / "conditioner" / "sana.yaml").read_text())["instruction"]
PROMPTS = ["A Red circle ", "a blue square on a long, long, long, long, long, long, long, long, long road"]


@pytest.fixture(scope="module")
def sana_folder(tmp_path_factory):
    return write_sana_folder(tmp_path_factory.mktemp("sana") / "Sana_tiny_diffusers")


@pytest.fixture(scope="module")
def pipeline(sana_folder):
    return SanaPipeline.from_pretrained(sana_folder)


def test_the_shipped_instruction_is_the_pipelines_default():
    default = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default
    assert default == SANA_INSTRUCTION


@pytest.mark.parametrize(("instruction", "max_length"), [(SANA_INSTRUCTION, 300), ([], 300), (["Describe:"], 12)])
def test_the_conditioner_equals_the_pipelines_encode_prompt(sana_folder, pipeline, instruction, max_length):
    cfg = ConditionerConfig(
        pretrained=str(sana_folder), kind="sana", max_length=max_length, instruction=instruction, memo_size=8
    )
    conditioner = build_text_encoder(cfg, torch.device("cpu"))
    assert conditioner.size == ConditionSize(TEXT_DIM)
    conditioner.encode(PROMPTS[:1])  # memoised alone: the memo must not change what a batch gives
    ours = conditioner.encode([*PROMPTS, ""])
    embeds, mask, negative, negative_mask = pipeline.encode_prompt(
        PROMPTS, True, negative_prompt="", max_sequence_length=max_length, complex_human_instruction=instruction
    )
    assert ours.sequence.shape == (3, max_length, TEXT_DIM) and ours.pooled is None
    torch.testing.assert_close(ours.sequence[:2], embeds, atol=1e-6, rtol=0)
    assert torch.equal(ours.mask[:2], mask)
    torch.testing.assert_close(ours.sequence[2:], negative[:1], atol=1e-6, rtol=0)  # "" without the instruction
    assert torch.equal(ours.mask[2:], negative_mask[:1])
    if instruction:  # the kept rows hold the instruction's last tokens before the prompt's
        assert mask[0].sum() > len(pipeline.tokenizer.tokenize(PROMPTS[0].lower().strip()))


def _tiny(**model) -> SanaTransformer2DModel:
    torch.manual_seed(0)
    cfg = ModelConfig(family="sana", **{**TRANSFORMER, **model})
    return build_dit(cfg, LATENT_CHANNELS, 8, ConditionSize(TEXT_DIM))


def _inputs(height: int = 8, width: int = 8, batch: int = 2):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, LATENT_CHANNELS, height, width, generator=generator)
    t = torch.tensor([700.0, 50.0])[:batch]
    mask = torch.ones(batch, 5, dtype=torch.long)
    mask[0, 3:] = 0
    return x, t, Condition(torch.randn(batch, 5, TEXT_DIM, generator=generator), mask)


def test_predict_calls_the_transformer_as_the_pipeline_does():
    dit = _tiny(extra_config={"timestep_scale": 2.0, "mlp_ratio": 2.0, "num_cross_attention_heads": 4,
                              "cross_attention_head_dim": 4})  # fmt: skip
    config = dit.transformer.config
    assert (config.caption_channels, config.cross_attention_dim, config.num_cross_attention_heads) == (16, 16, 4)
    assert config.timestep_scale == 2.0 and config.mlp_ratio == 2.0
    x, t, condition = _inputs()
    with torch.no_grad():
        ours = dit(x, t, condition)
        theirs = dit.transformer(
            x, encoder_hidden_states=condition.sequence, encoder_attention_mask=condition.mask,
            timestep=t * config.timestep_scale, return_dict=False,
        )[0]  # fmt: skip
        unscaled = dit.transformer(x, encoder_hidden_states=condition.sequence, timestep=t, return_dict=False)[0]
    assert torch.equal(ours, theirs) and not torch.allclose(ours, unscaled)


@pytest.mark.parametrize("extra", [{}, {"interpolation_scale": 1}])
def test_non_square_latents_train_with_and_without_a_positional_embedding(extra):
    """Buckets: Sana has no positional embedding by default; with a sin-cos one it is recomputed for the size."""
    dit = _tiny(extra_config=extra)
    x, t, condition = _inputs(8, 12)
    out = dit(x, t, condition)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.square().mean().backward()
    assert dit.transformer.transformer_blocks[0].ff.conv_inverted.weight.grad is not None


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        dit = _tiny()
        if checkpointing:
            enable_gradient_checkpointing(dit)
            assert dit.transformer.gradient_checkpointing
        dit(*_inputs()).square().mean().backward()
        grads.append([p.grad.clone() for p in dit.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_a_pretrained_transformer_for_other_text_features_is_refused(sana_folder):
    cfg = ModelConfig(family="sana", pretrained=str(sana_folder), subfolder="transformer")
    assert build_dit(cfg, LATENT_CHANNELS, 8, ConditionSize(TEXT_DIM)).transformer.config.caption_channels == 16
    with pytest.raises(ConfigError, match="expects 16-dim text features while the text encoder gives 384"):
        build_dit(cfg, LATENT_CHANNELS, 8, ConditionSize(384))


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        ("diffusion.objective=v_prediction", "diffusion.objective", "flow matching"),
        ("+model.extra_config.caption_channels=8", "model.extra_config.caption_channels", "follows `model.*`"),
        ("+model.extra_config.guidance_embeds=true", "model.extra_config", "Sana-Sprint"),
        ("model.cross_attention_dim=32", "model.cross_attention_dim", "heads x head_dim = 16"),
        ("conditioner.pooling=mean", "conditioner.pooling", "decides its pooled vector itself"),
    ],
)
def test_config_rules_name_the_key(sana_folder, override, key, says):
    with pytest.raises(ConfigError) as caught:
        compose_config([*TINY_SHAPES, *sana_overrides(sana_folder), override])
    assert says in one_paragraph(caught.value, key)
