"""The ``grpo`` section's checks (``grpo/checks.py``): a start whose weights are not safetensors is refused with the
config, before any model loads."""

import json

import pytest

from dit_trainer.errors import ConfigError
from dit_trainer.runs.run_folder import MANIFEST

from ..conftest import (
    SHAPES_TRANSFORMER,
    TINY_SHAPES,
    build_tiny_transformer,
    compose_config,
    grpo_overrides,
    one_paragraph,
)


def test_an_init_checkpoint_whose_weights_are_only_a_pickle_is_refused(tmp_path):
    from dit_trainer.assemble import save_resolved_config

    init = tmp_path / "init"
    checkpoint = init / "checkpoints" / "checkpoint-3"
    transformer = build_tiny_transformer(**SHAPES_TRANSFORMER).transformer
    transformer.save_pretrained(checkpoint / "transformer_ema", safe_serialization=False)  # a .bin, as planted
    (checkpoint / MANIFEST).write_text(json.dumps({"files": {}}))
    save_resolved_config(compose_config(TINY_SHAPES), init / "config.yaml")
    with pytest.raises(ConfigError) as caught:
        compose_config(grpo_overrides(init))
    assert "hold no .safetensors file" in one_paragraph(caught.value, "trainer.init_from")
