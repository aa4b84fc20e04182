"""``model.extra_config`` values checked against the family's transformer class (``families/arguments.py`` and
``base.require_further_arguments``): types read from the constructor's annotations (or its defaults), ranges the
families add, one paragraph at the config check instead of a TypeError in diffusers after the models load."""

import dataclasses
from typing import Any, Literal

import pytest
import torch
from omegaconf import OmegaConf

from dit_trainer.components.families import FAMILIES
from dit_trainer.components.families.arguments import constructor_parameters, describe, expected_type, fits
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig, TrainConfig, call_with_sections
from dit_trainer.errors import ConfigError

from ...conftest import TINY_SHAPES, compose_config, one_paragraph

NAMES = ("pixart_alpha", "dit", "sd3", "flux", "sana")
# The audit's Flux command: a tiny new Flux on the shapes data with MiniLM's mean-pooled vector.
FLUX = ("model.family=flux", "diffusion=flow", "diffusion.objective=flow_matching", "diffusion.resolution_shift=true",
        "conditioner.pooling=mean", "model.num_layers=1", "model.patch_size=2", "model.num_attention_heads=2",
        "model.attention_head_dim=8")  # fmt: skip
SD3 = ("+experiment=shapes_sd3", "model.num_layers=2")


@pytest.mark.parametrize("name", NAMES)
def test_every_default_of_every_family_fits_the_type_read_for_it(name):
    """The types read from diffusers' signatures hold its own defaults (and each can be said in words)."""
    for key, parameter in list(constructor_parameters(FAMILIES.get(name).transformer_class).items())[1:]:
        kind = expected_type(parameter)
        assert fits(parameter.default, kind) and describe(kind), (key, kind, parameter.default)


class Unannotated:
    def __init__(self, ratio=4, sizes=(1, 2), anything=None, name="x", flag=True, later: "NotImported" = 1.5):  # noqa: F821
        pass


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [("ratio", [2, 2.5], ["4", True]), ("sizes", [[1], (3, 4), []], [3, ["a"]]), ("anything", [None, "a", [1]], []),
     ("name", ["y"], [1, None]), ("flag", [False], [1, "true"]), ("later", [2, 0.5], ["x"])],
)  # fmt: skip
def test_an_argument_without_a_usable_annotation_takes_its_defaults_type(key, good, bad):
    """A numeric default stands for a number (an unannotated ``mlp_ratio=4`` may be 2.5), a tuple for a list of its
    items' type, None for anything; an annotation naming what its module does not import is read as absent."""
    kind = expected_type(constructor_parameters(Unannotated)[key])
    assert all(fits(value, kind) for value in good) and not any(fits(value, kind) for value in bad), kind


def test_values_fit_as_yaml_and_hydra_give_them():
    values = OmegaConf.create({"layers": [0, 1], "axes": [16, 56, 56], "nested": {"a": 1}})
    assert fits(values.layers, tuple[int, ...]) and not fits(3, tuple[int, ...]) and not fits("0,1", tuple[int, ...])
    assert fits(values.axes, tuple[int, int, int]) and not fits([16, 56], tuple[int, int, int])
    assert fits(values.nested, dict[str, int]) and fits(2, float) and not fits(True, int) and not fits(1, bool)
    assert fits(None, int | None) and not fits(None, int) and fits("rms_norm", str | None)
    assert fits("a", Literal["a", "b"]) and not fits("c", Literal["a", "b"]) and fits(object(), Any)
    assert describe(int | None) == "an integer or null" and describe(tuple[int, int, int]) == "a list of 3 integers"


@pytest.mark.parametrize(
    ("overrides", "key", "value", "says"),
    [((*SD3, "+model.extra_config.dual_attention_layers=3"), "dual_attention_layers", "3", "a list of integers"),
     ((*SD3, "+model.extra_config.pos_embed_max_size=abc"), "pos_embed_max_size", "'abc'", "takes an integer"),
     ((*TINY_SHAPES, *FLUX, "+model.extra_config.num_single_layers=x"), "num_single_layers", "'x'", "an integer"),
     ((*TINY_SHAPES, "+model.extra_config.norm_eps=abc"), "norm_eps", "'abc'", "PixArtTransformer2DModel's")],
)  # fmt: skip
def test_a_value_of_another_type_is_refused_at_the_config_check(overrides, key, value, says):
    """The audit's three commands (a TypeError in the check, after the models load, in diffusers' constructor)."""
    with pytest.raises(ConfigError) as caught:
        compose_config(list(overrides))
    message = one_paragraph(caught.value, f"model.extra_config.{key}")
    assert f"is {value}, but" in message and says in message and "or remove it" in message


def _check(name: str, **extra) -> None:
    """The family's own check of a new model with ``extra`` (its other rules satisfied)."""
    cfg = TrainConfig()
    cfg = dataclasses.replace(
        cfg,
        model=ModelConfig(family=name, patch_size=2, extra_config=extra),
        diffusion=dataclasses.replace(cfg.diffusion, objective="flow_matching"),
        conditioner=dataclasses.replace(cfg.conditioner, pooling="mean"),
    )
    call_with_sections(FAMILIES.get(name).check, cfg)


@pytest.mark.parametrize(
    ("name", "extra", "says"),
    [("sd3", {"pos_embed_max_size": 0}, "at least 1"), ("sd3", {"dual_attention_layers": [4]}, "0 .. 3"),
     ("sd3", {"qk_norm": "l2"}, "takes null, rms_norm, layer_norm"), ("flux", {"num_single_layers": -1}, "at least 0"),
     ("sana", {"num_cross_attention_heads": 0}, "at least 1"), ("sana", {"qk_norm": "rms"}, "rms_norm_across_heads"),
     ("pixart_alpha", {"norm_type": "layer_norm"}, "builds only with ada_norm_single"),
     ("pixart_alpha", {"activation_fn": "relu"}, "FeedForward takes gelu"),
     ("dit", {"norm_type": "ada_norm"}, "builds only with ada_norm_zero")],
)  # fmt: skip
def test_a_value_out_of_the_range_its_class_documents_is_refused(name, extra, says):
    with pytest.raises(ConfigError) as caught:
        _check(name, **extra)
    assert says in one_paragraph(caught.value, f"model.extra_config.{next(iter(extra))}")


@pytest.mark.parametrize("name", NAMES)
def test_values_of_the_right_type_and_range_pass(name):
    extra = {
        "sd3": {"dual_attention_layers": [0, 3], "qk_norm": "rms_norm", "pos_embed_max_size": 8},
        "flux": {"num_single_layers": 0, "axes_dims_rope": [4, 14, 14], "guidance_embeds": False},
        "sana": {"qk_norm": None, "mlp_ratio": 2, "interpolation_scale": 1},
    }.get(name, {"norm_eps": 1e-5})
    _check(name, **extra)


@pytest.mark.parametrize(("name", "condition"), [("pixart_alpha", ConditionSize(12)), ("dit", ConditionSize(3))])
def test_pixart_and_dit_build_with_their_further_arguments(name, condition):
    """Both took none before: their `model.extra_config` was silently ignored."""
    torch.manual_seed(0)
    cfg = ModelConfig(family=name, num_layers=1, num_attention_heads=2, attention_head_dim=8, patch_size=2,
                      extra_config={"norm_eps": 1e-3, "activation_fn": "gelu"})  # fmt: skip
    config = FAMILIES.get(name).build(cfg, 4, 8, condition).config
    assert (config.norm_eps, config.activation_fn) == (1e-3, "gelu")
