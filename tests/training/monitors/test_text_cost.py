"""The warning at start when encoding every caption every step costs a large share of the DiT's step
(``training/monitors/text_cost.py``), with both FLOP counts; no warning where the encoder is cheap, remembers its
captions, or has no weights (class labels)."""

import logging

from accelerate.state import PartialState
from torch.utils.flop_counter import FlopCounterMode

from dit_trainer.training.monitors.text_cost import encoding_flops, live_encoding_cost, warn_live_text_encoding
from tests.conftest import TINY_SHAPES, class_conditional, components_of, compose_config

WARNING = "The text encoder encodes every caption every step"


def _warnings(overrides: list[str], caplog) -> list[str]:
    cfg = compose_config(overrides)
    parts = components_of(cfg)
    PartialState()  # accelerate's logger asks which process it is on
    with caplog.at_level(logging.WARNING):
        warn_live_text_encoding(cfg.conditioner, cfg.trainer.batch_size, parts)
    return [record.message for record in caplog.records if WARNING in record.message]


def test_the_parameter_count_matches_the_counted_flops(tiny_parts):
    """2 x weights x tokens: within 2 % of what FlopCounterMode counts for MiniLM (its matmuls; the embedding
    tables only look up)."""
    with FlopCounterMode(display=False) as counted:
        tiny_parts.text_encoder.encode_uncached(["a red circle"])
    assert abs(encoding_flops(tiny_parts.text_encoder, 8) / counted.get_total_flops() - 1) < 0.02


def test_an_expensive_live_encoder_is_warned_about_with_both_counts(caplog):
    """MiniLM (22.7 M parameters) beside the 1.3 M-parameter shapes DiT: ~3x the DiT's step."""
    (message,) = _warnings([*TINY_SHAPES, "conditioner.memo_size=0"], caplog)
    assert "TFLOP per step of trainer.batch_size=16" in message and "scripts/precompute.py" in message
    assert "data.cache_dir=DIR" in message


def test_no_warning_when_captions_are_remembered_or_the_encoder_is_cheap(caplog, tiny_t5_dir, digits):
    assert not _warnings(TINY_SHAPES, caplog)  # the shapes default remembers its 24 captions
    tiny_t5 = ["conditioner=t5", f"conditioner.pretrained={tiny_t5_dir}", "conditioner.memo_size=0"]
    cfg = compose_config([*TINY_SHAPES, *tiny_t5])
    parts = components_of(cfg)
    text, dit = live_encoding_cost(cfg.conditioner, cfg.trainer.batch_size, parts)
    assert 0 < text < 0.25 * dit  # a 2-layer, 32-wide T5 at 120 tokens
    assert not _warnings([*TINY_SHAPES, *tiny_t5], caplog)
    labels = [*TINY_SHAPES, *class_conditional(digits), "conditioner.memo_size=0"]
    assert not _warnings(labels, caplog)  # class labels: ids, no weights, nothing to encode
