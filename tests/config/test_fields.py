"""Single-field checks declared beside their fields (``config/fields.py``)."""

import pytest

from dit_trainer.errors import ConfigError


def test_field_checks_pass_through_omegaconf_and_catch_a_merged_value():
    from omegaconf import OmegaConf

    from dit_trainer.config import TrainConfig, check_fields

    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(["trainer.batch_size=0"]))
    cfg = OmegaConf.to_object(merged)
    assert cfg.trainer.batch_size == 0 and cfg.trainer.max_steps == TrainConfig().trainer.max_steps
    with pytest.raises(ConfigError, match=r"`trainer.batch_size` is 0, but it must be >= 1.*`trainer.batch_size=1`"):
        check_fields(cfg)


def test_null_is_checked_where_the_field_is_not_optional():
    """``data.buckets=null`` (typed Any) slipped past as "not set" and failed in the bucket code with a bare
    TypeError; a field typed ``X | None`` still takes null as "not set"."""
    from omegaconf import OmegaConf

    from dit_trainer.config import TrainConfig, check_fields

    def checked(*overrides: str) -> None:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(list(overrides)))
        check_fields(OmegaConf.to_object(merged))

    refused = r"`data.buckets` is None, but it must be none, .*\(none as a word: null is no setting here\)"
    with pytest.raises(ConfigError, match=refused):
        checked("data.buckets=null")
    checked("data.fps=null", "data.buckets=none")
