"""Train a text-conditioned DiT: ``python train.py +experiment=shapes`` (CPU) or ``+experiment=dit`` (cluster).

Exit codes (``dit_trainer.errors``): 0 trained to ``trainer.max_steps``; 2 a bad config value, a missing model, an
unwritable run folder or a gradient-flow problem (nothing trained, and no run folder left behind); 3 preempted by
SIGTERM/SIGUSR1 after writing a checkpoint (requeue with ``trainer.resume=latest``); 4 stopped after
``trainer.max_consecutive_nonfinite`` non-finite steps; 5 a checkpoint could not be written (disk full, quota),
earlier checkpoints are intact; 130 stopped by Ctrl-C, after writing a checkpoint (at once on a second Ctrl-C). When
one process of a multi-process run fails, the others stop with its message and code (``dit_trainer.runs.failures``).

``python train.py trainer.resume=RUN [overrides]`` continues the run in the folder RUN with the config it recorded
(``dit_trainer.run_config.continue_run``).
"""

from __future__ import annotations

import logging
import os
import sys
from functools import partial
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dit_trainer.config import register_configs
from dit_trainer.config.command_line import check_command_line
from dit_trainer.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PREEMPTED, USER_ERRORS, ConfigError, exit_code
from dit_trainer.run_config import continue_run, to_train_config
from dit_trainer.runs.failures import (
    Failure,
    FailureWatch,
    is_multi_process,
    let_the_others_notice,
    record_failure,
)
from dit_trainer.runs.launch_folder import discard_refused_start
from dit_trainer.runs.process_exit import exit_without_finalizing
from dit_trainer.runs.run_lock import release_held

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
INFO_FLAGS = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "-sc", "--shell-completion"}
RECORD_KEY = "hydra.output_subdir"  # where Hydra writes its record of the launch; null: nowhere
register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # The others stop with a failed one; the main process then leaves the folder as a refusal would.
    watch = FailureWatch(run_dir, partial(discard_after, run_dir)).start() if is_multi_process() else None
    try:
        train_cfg = to_train_config(cfg, HydraConfig.get().overrides.task, run_dir)
        from dit_trainer.assemble import run  # the training stack: only once the config is known to be good
        from dit_trainer.training.metrics import log_lines_to_files_only

        log_lines_to_files_only()  # a line per log step in train.log; the console has the progress bar
        logging.captureWarnings(True)  # Python warnings (the fallback schedule's, the libraries') reach train.log too
        try:
            result = run(train_cfg, run_dir)  # it logs the start banner and the closing summary (main process)
        finally:
            logging.captureWarnings(False)  # as it was: main also runs in tests' processes
    except USER_ERRORS as error:
        if watch is not None:  # an error caused by another process's failure (a folder it removed) reports that
            watch.stop_if_failed_elsewhere(timeout=0.0)
        print(f"error: {error}", file=sys.stderr)  # first: the launcher may end this process while it lingers
        if exit_code(error) == EXIT_BAD_INPUT:
            discard_refused_start(run_dir)  # the folder Hydra made for this start, if nothing was trained in it
        if watch is not None:
            record_failure(run_dir, exit_code(error), str(error))
            let_the_others_notice()
        sys.exit(exit_code(error))
    except KeyboardInterrupt:  # Ctrl-C before training started, or a second one: stop at once, no traceback
        discard_refused_start(run_dir)
        if os.environ.get("RANK", "0") == "0":
            kept = f"; checkpoints in {run_dir} are those complete before it" if run_dir.exists() else ""
            print(f"Stopped by Ctrl-C{kept}.", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception:
        if watch is not None:
            watch.stop_if_failed_elsewhere(timeout=5.0)
        raise
    finally:
        release_held(run_dir)  # the lock the launch took, if no run took it over (main also runs in tests' processes)
    if result.preempted:
        if os.environ.get("RANK", "0") == "0":
            stopped = "Interrupted by Ctrl-C" if result.interrupted else "Preempted"
            print(
                f"{stopped} at step {result.steps}; checkpoint written. Continue with "
                f"`python train.py trainer.resume={result.run_dir}`."
            )
        sys.exit(EXIT_INTERRUPTED if result.interrupted else EXIT_PREEMPTED)


def discard_after(run_dir: Path, failure: Failure) -> None:
    """What this process does when another's refused start ends it: the folder as the launch found it."""
    if failure.exit_code == EXIT_BAD_INPUT:
        discard_refused_start(run_dir)


def command_line(argv: list[str]) -> list[str]:
    """The overrides ``main`` composes from ``argv``: checked against the schema first (a mistyped key is named with
    the keys it may have meant, before Hydra's bare error), and with ``trainer.resume=RUN`` that run's recorded
    config as the base (``continue_run``). A bad one ends the process with its exit code."""
    try:
        check_command_line(argv, CONFIG_DIR)
        continuation = continue_run(argv)  # trainer.resume=RUN: that run's config, in its folder
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(exit_code(error))
    if continuation is None:
        return argv
    if os.environ.get("RANK", "0") == "0" and not INFO_FLAGS.intersection(argv):  # not into --cfg's YAML
        start = continuation.checkpoint or "its newest checkpoint"
        where = "in its folder" if continuation.in_place else "in a new folder"
        changed = " ".join(continuation.overrides) or "none"
        print(f"Continuing {continuation.run_dir} from {start} {where}, with the config it recorded and the "
              f"overrides given now: {changed}")  # fmt: skip
    return continuation.argv


def record_on_the_main_process(overrides: list[str]) -> list[str]:
    """``overrides`` for this process: all but the main one write no Hydra record of the launch (``.hydra/``), whose
    copies would race the main process's, and its putting the record back after a refused start (``launch_folder``)."""
    if os.environ.get("RANK", "0") == "0":
        return overrides
    kept = [item for item in overrides if item.lstrip("+~").partition("=")[0] != RECORD_KEY]
    return [*kept, f"{RECORD_KEY}=null"]


if __name__ == "__main__":
    sys.argv[1:] = record_on_the_main_process(command_line(sys.argv[1:]))
    if not is_multi_process():
        main()
    else:  # everything is written once main returns: no interpreter teardown may hang the launch
        try:
            main()
        except SystemExit as stop:
            exit_without_finalizing(stop.code)
        exit_without_finalizing()
