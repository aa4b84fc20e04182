"""The configuration, the ground of the package: typed dataclasses (``schema``, ``grpo``: the one source of defaults)
registered with Hydra, field checks beside their fields (``fields``), closed vocabularies (``choices``), the
scripts' command lines (``scripts``), and what a recorded config is read back as (``recorded``). It imports nothing
of dit-trainer but ``errors``, and neither torch nor diffusers, so a config is composed and its fields checked in a
fraction of a second.

Hydra composes YAML onto the schema (so a mistyped key or a non-integer batch size fails at compose time);
``dit_trainer.run_config`` then checks the fields and has each part check its own section, and raises one readable
``ConfigError`` paragraph before any model is built. Nothing past the ``build_*`` functions sees YAML or OmegaConf.
"""

from dit_trainer.config.conditioner import ConditionerConfig
from dit_trainer.config.fields import check_fields
from dit_trainer.config.monitors import FIDMonitorConfig, MonitorConfig, RewardMonitorConfig, ValidationConfig
from dit_trainer.config.precision import PrecisionConfig
from dit_trainer.config.resolvers import ASSETS_DIR, register_configs, register_resolvers
from dit_trainer.config.schema import (
    DataConfig,
    DiffusionConfig,
    GRPOConfig,
    LoggerConfig,
    LoRAConfig,
    MixtureSource,
    ModelConfig,
    NFTConfig,
    OptimConfig,
    PrivacyConfig,
    RewardConfig,
    TrainConfig,
    TrainerConfig,
    VAEConfig,
    section_types,
)
from dit_trainer.config.scripts import EXPORT_DTYPES, EvaluateConfig, ExportConfig, PreviewConfig, SampleConfig
from dit_trainer.config.sections import call_with_sections

__all__ = [
    "ConditionerConfig",
    "ASSETS_DIR",
    "EXPORT_DTYPES",
    "DataConfig",
    "DiffusionConfig",
    "EvaluateConfig",
    "ExportConfig",
    "FIDMonitorConfig",
    "GRPOConfig",
    "NFTConfig",
    "LoRAConfig",
    "LoggerConfig",
    "MixtureSource",
    "ModelConfig",
    "MonitorConfig",
    "OptimConfig",
    "PreviewConfig",
    "PrecisionConfig",
    "PrivacyConfig",
    "RewardMonitorConfig",
    "RewardConfig",
    "SampleConfig",
    "TrainConfig",
    "TrainerConfig",
    "VAEConfig",
    "section_types",
    "ValidationConfig",
    "call_with_sections",
    "check_fields",
    "register_configs",
    "register_resolvers",
]
