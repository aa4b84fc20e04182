"""The sd3 family (``SD3Transformer2DModel``) and its conditioner (``conditioner.kind=sd3``): built from the
config and the conditioner's sizes, refused clearly where it cannot work, and conditioned exactly as
``StableDiffusion3Pipeline`` conditions it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from diffusers.models.normalization import RMSNorm

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.families.sd3 import LORA_TARGETS
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, ModelConfig
from dit_trainer.errors import ConfigError, ModelLoadError

from ...conftest import TINY_SHAPES, compose_config, one_paragraph
from ...tiny_sd3 import SD35_EXTRA, T5_LENGTH, TRANSFORMER, write_tiny_sd3

SD3 = FAMILIES.get("sd3")
PROMPTS = ["a red circle", "", "a blue square on a very long caption that T5 has to cut short"]
FLOW = ("model.family=sd3", "diffusion=flow", "diffusion.objective=flow_matching")


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory) -> Path:
    return write_tiny_sd3(tmp_path_factory.mktemp("tiny_sd3"))


def _encoders(root: Path, memo_size: int = 0):
    cfg = ConditionerConfig(kind="sd3", pretrained=str(root), max_length=T5_LENGTH, memo_size=memo_size)
    return build_text_encoder(cfg, torch.device("cpu"))


def test_the_conditioner_gives_what_the_pipeline_encodes(sd3_dir):
    encoders = _encoders(sd3_dir)
    condition = encoders.encode(PROMPTS)
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    with torch.no_grad():
        embeds, _, pooled, _ = pipe.encode_prompt(
            PROMPTS, None, None, do_classifier_free_guidance=False, max_sequence_length=T5_LENGTH
        )
    assert torch.equal(condition.sequence, embeds) and torch.equal(condition.pooled, pooled)
    assert condition.sequence.shape == (3, 77 + T5_LENGTH, 32) and condition.pooled.shape == (3, 8 + 16)
    assert encoders.size == ConditionSize(32, 24)
    assert torch.equal(condition.mask, torch.ones(3, 77 + T5_LENGTH, dtype=torch.long))  # SD3 attends to all


def test_the_memo_is_exact_whatever_order_prompts_come_in(sd3_dir):
    """Encoded alone (with the memo on), a prompt's condition does not depend on the prompts it arrived with."""
    one, other = _encoders(sd3_dir, memo_size=8), _encoders(sd3_dir, memo_size=8)
    first = one.encode(PROMPTS)
    other.encode(PROMPTS[1:])
    for a, b in zip(first, other.encode(PROMPTS)):
        assert torch.equal(a, b)


def _tiny(**extra) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(family="sd3", **TRANSFORMER, extra_config={**SD35_EXTRA, **extra})
    return SD3.build(cfg, 16, 8, ConditionSize(32, 24))


def _condition(batch: int) -> Condition:
    generator = torch.Generator().manual_seed(0)
    return Condition(
        torch.randn(batch, 5, 32, generator=generator),
        torch.ones(batch, 5),
        torch.randn(batch, 24, generator=generator),
    )


def test_a_new_transformer_follows_the_config_and_the_conditioner():
    transformer = _tiny()
    config = transformer.config
    assert (config.joint_attention_dim, config.pooled_projection_dim, config.caption_projection_dim) == (32, 24, 16)
    assert config.pos_embed_max_size == 8 and config.in_channels == config.out_channels == 16
    blocks = transformer.transformer_blocks
    assert blocks[0].attn2 is not None and blocks[1].attn2 is None  # MMDiT-X's dual attention in block 0 only
    assert isinstance(blocks[0].attn.norm_q, RMSNorm)  # qk_norm
    assert SD3.mismatch(dict(config), 16, ConditionSize(32, 24)) is None
    assert "24-dim pooled text vector while the text encoder gives none" in SD3.mismatch(
        dict(config), 16, ConditionSize(32, None)
    )
    assert "32-dim text features" in SD3.mismatch(dict(config), 16, ConditionSize(384, 384))
    assert "16 input channels" in SD3.mismatch(dict(config), 4, ConditionSize(32, 24))


def test_a_positional_table_smaller_than_the_latent_is_refused():
    with pytest.raises(ConfigError) as caught:
        _tiny(pos_embed_max_size=3)
    assert "latent size 8 in patches of 2" in one_paragraph(caught.value, "model.extra_config.pos_embed_max_size")


def test_predict_takes_any_bucket_up_to_twice_the_size_and_uses_the_pooled_vector():
    transformer = _tiny()
    condition = _condition(2)
    x_t = torch.randn(2, 16, 8, 16)  # a 1:2 bucket of the 8 x 8 latent size
    prediction = SD3.predict(transformer, x_t, torch.tensor([500.0]), condition)
    assert prediction.shape == x_t.shape
    other = SD3.predict(transformer, x_t, torch.tensor([500.0]), condition._replace(pooled=condition.pooled + 1))
    assert not torch.allclose(prediction, other)


def test_gradient_checkpointing_gives_the_same_gradients():
    x_t, t, condition = torch.randn(2, 16, 8, 8), torch.tensor([300.0, 700.0]), _condition(2)
    grads = []
    for checkpointing in (False, True):
        transformer = _tiny().train()
        if checkpointing:
            transformer.enable_gradient_checkpointing()
        SD3.predict(transformer, x_t, t, condition).square().mean().backward()
        grads.append(transformer.transformer_blocks[0].attn2.to_q.weight.grad)
    assert grads[0].abs().sum() > 0 and torch.allclose(grads[0], grads[1], atol=1e-6)


def test_lora_targets_cover_both_streams_and_the_dual_attention():
    names = [name for name, module in _tiny().named_modules() if isinstance(module, torch.nn.Linear)]
    targeted = [name for name in names if any(name == t or name.endswith("." + t) for t in LORA_TARGETS)]
    block = "transformer_blocks.0."
    for module in ("attn.to_q", "attn.add_q_proj", "attn.to_add_out", "attn2.to_v", "ff.net.2", "ff_context.net.2"):
        assert block + module in targeted, module
    assert not any("norm" in name or "time_text_embed" in name for name in targeted)  # modulation stays frozen


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        ((*FLOW,), "conditioner.pooling", "pooled text vector"),
        (("model.family=sd3", "conditioner.pooling=mean"), "diffusion.objective", "rectified-flow"),
        ((*FLOW, "conditioner.pooling=mean", "+model.extra_config.qk_nrom=rms_norm"), "model.extra_config.qk_nrom",
         "no such argument"),
        ((*FLOW, "conditioner.pooling=mean", "+model.extra_config.in_channels=4"), "model.extra_config.in_channels",
         "follows `model.*`"),
        ((*FLOW, "conditioner.pooling=mean", "+model.extra_config.dual_attention_layers=[0,2]"),
         "model.extra_config.dual_attention_layers", "block indices in 0 .. 1"),
        ((*FLOW, "conditioner.pooling=mean", "model.learned_sigma=true"), "model.learned_sigma", "velocity"),
        ((*FLOW, "conditioner.kind=sd3", "conditioner.max_length=600"), "conditioner.max_length", "512"),
    ],
)  # fmt: skip
def test_a_run_that_cannot_work_is_refused_naming_the_key(overrides, key, says):
    with pytest.raises(ConfigError) as caught:
        compose_config([*TINY_SHAPES, *overrides])
    assert says in one_paragraph(caught.value, key)


@pytest.mark.parametrize("experiment", ["sd35_medium", "sd35_grpo", "sd35_nft"])
def test_the_recipes_stop_at_once_offline_naming_the_missing_model(experiment, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    with pytest.raises(ModelLoadError, match="stabilityai/stable-diffusion-3.5-medium"):
        compose_config([f"+experiment={experiment}", f"data.path={tmp_path}"])


def test_images_beyond_a_pretrained_models_positional_table_are_refused_with_the_config(sd3_dir, tmp_path):
    """diffusers failed in the first forward ("Height (16) cannot be greater than `pos_embed_max_size`"), after
    every model had loaded, with a bare traceback. The tiny model's table covers 8 patches of 2 latents: 32 px."""
    from ...data.files import photos_folder
    from ...tiny_sd3 import overrides

    pretrained = [*TINY_SHAPES, *overrides(sd3_dir), f"model.pretrained={sd3_dir}", "model.subfolder=transformer"]
    compose_config([*pretrained, "data.resolution=32"])
    with pytest.raises(ConfigError) as caught:
        compose_config([*pretrained, "data.resolution=64"])
    message = one_paragraph(caught.value, "data.resolution")
    assert "images 64 px on a side" in message and "positions for at most 32 px" in message
    folder = ["data=imagefolder", f"data.path={photos_folder(tmp_path / 'photos', count=4, bad=0)}"]
    with pytest.raises(ConfigError, match=r"`data.buckets` is \[\[16, 48\]\], but it asks for images 48 px"):
        compose_config([*pretrained, *folder, "data.resolution=16", "data.buckets=[[16,48]]"])
