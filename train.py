"""Train a text-conditioned DiT: ``python train.py +experiment=shapes`` (CPU) or ``+experiment=dit`` (cluster).

Exit codes (``dit_trainer.errors``): 0 trained to ``trainer.max_steps``; 2 a bad config value, a missing model, an
unwritable run folder or a gradient-flow problem (nothing trained); 3 preempted by SIGTERM/SIGUSR1 after writing a
checkpoint (requeue with ``trainer.resume=latest``); 4 stopped after ``trainer.max_consecutive_nonfinite``
non-finite steps; 5 a checkpoint could not be written (disk full, quota), earlier checkpoints are intact. When one
process of a multi-process run fails, the others stop with its message and code (``dit_trainer.failures``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dit_trainer.config import register_configs
from dit_trainer.config.command_line import check_command_line
from dit_trainer.errors import EXIT_PREEMPTED, USER_ERRORS, ConfigError, exit_code
from dit_trainer.failures import FailureWatch, is_multi_process, record_failure
from dit_trainer.run_config import to_train_config

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    watch = FailureWatch(run_dir).start() if is_multi_process() else None  # the others stop with a failed one
    try:
        train_cfg = to_train_config(cfg, HydraConfig.get().overrides.task, run_dir)
        from dit_trainer.training.run import run  # the training stack: only once the config is known to be good

        result = run(train_cfg, run_dir)
    except USER_ERRORS as error:
        if watch is not None:  # an error caused by another process's failure (a folder it removed) reports that
            watch.stop_if_failed_elsewhere(timeout=0.0)
            record_failure(run_dir, exit_code(error), str(error))
        print(f"error: {error}", file=sys.stderr)
        sys.exit(exit_code(error))
    except Exception:
        if watch is not None:
            watch.stop_if_failed_elsewhere(timeout=5.0)
        raise
    if result.preempted:
        print(
            f"Preempted at step {result.steps}; checkpoint written. Resume with trainer.resume=latest in "
            f"{result.run_dir}."
        )
        sys.exit(EXIT_PREEMPTED)
    print(
        f"Trained {result.steps} steps in {result.seconds:.0f} s ({result.seconds / max(result.steps, 1):.3f} s/step), "
        f"final loss {result.final_loss:.4f}; monitors took {result.monitor_seconds:.1f} s "
        f"({100 * result.monitor_seconds / max(result.seconds, 1e-9):.1f}% of it). Run folder: {result.run_dir}"
    )


if __name__ == "__main__":
    try:
        check_command_line(sys.argv[1:], CONFIG_DIR)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(exit_code(error))
    main()
