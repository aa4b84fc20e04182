"""The configuration: typed dataclasses (``schema``, the one source of defaults) registered with Hydra, field checks
beside their fields (``fields``), the rules across fields (``rules``), and the scripts' command lines (``scripts``).

Hydra composes YAML onto the schema (so a mistyped key or a non-integer batch size fails at compose time);
``validate`` then checks what types cannot express and raises one readable ``ConfigError`` paragraph before any
model is built. Nothing past the ``build_*`` functions sees YAML or OmegaConf.
"""

from dit_trainer.config.fields import check_fields
from dit_trainer.config.resolvers import ASSETS_DIR, register_configs, register_resolvers
from dit_trainer.config.rules import to_train_config, validate
from dit_trainer.config.schema import (
    DataConfig,
    DiffusionConfig,
    FIDMonitorConfig,
    GRPOConfig,
    GRPOMonitorConfig,
    LoggerConfig,
    LoRAConfig,
    MixtureSource,
    ModelConfig,
    MonitorConfig,
    OptimConfig,
    PrivacyConfig,
    RewardConfig,
    TextEncoderConfig,
    TrainConfig,
    TrainerConfig,
    VAEConfig,
    ValidationConfig,
)
from dit_trainer.config.scripts import EXPORT_DTYPES, EvaluateConfig, ExportConfig, SampleConfig

__all__ = [
    "ASSETS_DIR",
    "EXPORT_DTYPES",
    "DataConfig",
    "DiffusionConfig",
    "EvaluateConfig",
    "ExportConfig",
    "FIDMonitorConfig",
    "GRPOConfig",
    "GRPOMonitorConfig",
    "LoRAConfig",
    "LoggerConfig",
    "MixtureSource",
    "ModelConfig",
    "MonitorConfig",
    "OptimConfig",
    "PrivacyConfig",
    "RewardConfig",
    "SampleConfig",
    "TextEncoderConfig",
    "TrainConfig",
    "TrainerConfig",
    "VAEConfig",
    "ValidationConfig",
    "check_fields",
    "register_configs",
    "register_resolvers",
    "to_train_config",
    "validate",
]
