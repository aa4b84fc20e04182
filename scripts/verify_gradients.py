"""Check that the configured training trains the DiT and nothing else, on one real batch, before a long run.

    python scripts/verify_gradients.py +experiment=shapes [key=value ...]     # the same config as train.py

Prints the trainable/frozen parameters per component, the gradient-flow doctor's report (why a loss would have no
grad_fn, which parameters get no gradient, and how to fix it), gradient norms, and whether two optimizer steps moved
every trainable parameter and left every frozen one bit-identical. Exit code 0 when healthy, 1 otherwise, 2 for a
bad config value. Writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.config import ConfigError, register_configs, to_train_config
from dit_trainer.hub import ModelLoadError
from dit_trainer.verification import verify_training_setup

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def main(overrides: list[str]) -> int:
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = to_train_config(compose(config_name="train", overrides=overrides))
        report = verify_training_setup(cfg)
    except (ConfigError, ModelLoadError, HydraException, OmegaConfBaseException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
