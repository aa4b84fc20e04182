"""Experiment trackers through accelerate: W&B, TensorBoard, or none. ``metrics.jsonl`` is written regardless.

A tracker is checked before anything is built: its package must be installed (accelerate would only warn, and the run
would fail at its first sample grid), and W&B, when it will run online, needs credentials. W&B's own conventions
hold: ``logger.mode`` unset leaves the mode to ``WANDB_MODE`` (and ``wandb offline``); the run is named after the run
folder, grouped and tagged by the experiment, and records the run folder's path in its config.

Under differential privacy, metrics computed on the private batches (the loss above all) are not covered by the
guarantee. Trackers that send what they log elsewhere (W&B: online at once, offline when synced) then get only the
metrics that depend on the noised model, the settings or the clock, unless ``privacy.log_losses_to_trackers``.
TensorBoard writes event files into the run folder, beside ``metrics.jsonl``, which holds everything anyway: it
gets everything too.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import string
import sys
from pathlib import Path

from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.tracking import GeneralTracker

from dit_trainer.config import LoggerConfig, PrivacyConfig
from dit_trainer.durable import write_text_atomically
from dit_trainer.errors import ConfigError

logger = get_logger(__name__)

# The packages a tracker needs (any one of them), the first being what to install.
PACKAGES = {"wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX")}
WANDB_RUN_ID = "wandb_run_id"  # in the run folder: the W&B run a resume continues
OFFLINE_FIX = (
    "log offline with `WANDB_MODE=offline` (or `logger.mode=offline`) and upload later with "
    "`wandb sync RUN/wandb/offline-run-*`"
)

LOCAL_TRACKERS = ("tensorboard",)  # write only into the run folder
# Under DP, what may leave the run folder: the schedule, the norm of the noised gradient the optimizer applied, the
# throughput, the privacy spent, and the monitors (they sample the trained model). Anything else, including metrics
# added later, is held back until listed here.
PRIVATE_SAFE_METRICS = ("train/lr", "train/grad_norm", "train/images_per_sec", "train/seconds_per_step",
                        "privacy/epsilon")  # fmt: skip
PRIVATE_SAFE_SECTIONS = ("reward/", "grpo/", "samples/", "monitor/")


def private_safe(key: str) -> bool:
    return key in PRIVATE_SAFE_METRICS or key.startswith(PRIVATE_SAFE_SECTIONS)


class PrivateSafeMetrics(GeneralTracker):
    """A tracker that passes on only ``private_safe`` metrics, and images (sample and reward grids, which only read
    the trained model), to the tracker it wraps."""

    requires_logging_directory = False

    def __init__(self, inner: GeneralTracker) -> None:
        super().__init__(_blank=True)
        self.inner = inner
        self.name = inner.name

    @property
    def tracker(self):
        return self.inner.tracker

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        safe = {key: value for key, value in values.items() if private_safe(key)}
        if safe:
            self.inner.log(safe, step=step, **kwargs)

    def log_images(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.inner.log_images(values, step=step, **kwargs)

    def finish(self) -> None:
        self.inner.finish()


def withhold_private_metrics(accelerator: Accelerator, privacy: PrivacyConfig) -> None:
    """Under DP (and unless the user opted in), wrap every tracker that is not local in ``PrivateSafeMetrics``
    and say so once."""
    if not privacy.enabled or privacy.log_losses_to_trackers:
        return
    remote = [tracker.name for tracker in accelerator.trackers if tracker.name not in LOCAL_TRACKERS]
    if not remote:
        return
    accelerator.trackers = [
        tracker if tracker.name in LOCAL_TRACKERS else PrivateSafeMetrics(tracker) for tracker in accelerator.trackers
    ]
    logger.warning(
        f"privacy.enabled: the loss and other metrics computed on the private batches, which the DP guarantee does "
        f"not cover, are not sent to {', '.join(remote)} (metrics.jsonl has them all). Set "
        "privacy.log_losses_to_trackers=true to send them anyway.",
        main_process_only=True,
    )


def check_trackers(cfg: LoggerConfig) -> None:
    """Refuse, before anything is built, a tracker whose package is missing and W&B online without credentials."""
    if cfg.name == "none":
        return
    packages = PACKAGES[cfg.name]
    if not any(importlib.util.find_spec(package) for package in packages):
        raise ConfigError(
            "logger",
            cfg.name,
            f"the {packages[0]} package is not installed in this Python environment ({sys.executable}), and the run "
            "would fail at its first sample grid",
            f"install it (`pip install {packages[0]}`, or `bash scripts/install.sh test`), or train without a "
            "tracker (`logger=none`: every run writes metrics.jsonl)",
        )
    if cfg.name == "wandb" and wandb_mode(cfg) not in ("offline", "disabled"):
        check_wandb_credentials(cfg)


def check_wandb_credentials(cfg: LoggerConfig) -> None:
    """W&B online needs credentials: without them ``wandb.init`` fails (or prompts) after every model has loaded."""
    import wandb

    try:
        found = wandb_credentials_found()
    except wandb.errors.AuthenticationError as error:  # e.g. a malformed WANDB_API_KEY
        raise ConfigError(
            "logger",
            "wandb",
            f"W&B refuses the credentials it found ({error})",
            f"run `wandb login --relogin` (or set a valid `WANDB_API_KEY`), or {OFFLINE_FIX}",
        ) from error
    if not found:
        source = "`logger.mode=online`" if cfg.mode else "neither `logger.mode` nor `WANDB_MODE` is set"
        raise ConfigError(
            "logger.mode",
            "online",
            f"W&B would run online ({source}), and no W&B API key is configured on this machine (no "
            "`WANDB_API_KEY`, no `wandb login`)",
            f"log in once with `wandb login` (or set `WANDB_API_KEY`), or {OFFLINE_FIX}",
        )


def wandb_mode(cfg: LoggerConfig) -> str:
    """The mode W&B will run in: ``logger.mode`` when set (it overrides the environment), else W&B's own settings
    (``WANDB_MODE``, ``wandb offline``), online when nothing says otherwise."""
    if cfg.mode:
        return cfg.mode
    from wandb.sdk import wandb_setup

    mode = os.environ.get("WANDB_MODE") or wandb_setup.singleton().settings.mode
    return {"dryrun": "offline", "run": "online"}.get(mode, mode)


def wandb_credentials_found() -> bool:
    """Whether W&B finds credentials without prompting (its environment variables, ``~/.netrc``, its settings).
    The lookup is W&B's internal one: where a W&B version moved it, the answer is yes and ``wandb.init`` decides."""
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib.wbauth.authenticate import authenticate_session

        host = wandb_setup.singleton().settings.base_url
        found = authenticate_session(host=host, source="dit-trainer", prompt=False, update_session=False)
    except (ImportError, AttributeError, TypeError):
        return True
    return found is not None


def tracker_name(cfg: LoggerConfig) -> str | None:
    """What to pass as ``Accelerator(log_with=...)``: none for W&B disabled (``wandb_mode``: by ``logger.mode``,
    ``WANDB_MODE`` or ``wandb disabled``)."""
    if cfg.name == "wandb" and wandb_mode(cfg) == "disabled":
        return None
    return None if cfg.name == "none" else cfg.name


def flat_config(config: dict, prefix: str = "") -> dict[str, int | float | str | bool]:
    """``{"trainer": {"lr": 1}}`` -> ``{"trainer.lr": 1}``, non-scalars as text: every tracker accepts this."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def which_wandb_run(cfg: LoggerConfig, run_dir: Path, resume: str | None) -> dict:
    """``wandb.init``'s ``id`` (and ``resume``): which W&B run this one logs to. A run resumed online from its newest
    checkpoint (``trainer.resume=latest``, or the run folder) continues the W&B run its folder started (the id is
    kept in ``RUN/wandb_run_id``): the steps an interrupted attempt logged after that checkpoint come again with the
    same values (the resume is exact), and W&B keeps the first. Every other start gets a new W&B run: a fresh run, a
    resume from a checkpoint named by path (an older one: W&B drops every step below the run's last, so the new
    branch would not show until it passed the old one), or an offline one (``wandb sync`` of two offline folders of
    one id keeps only the last one's history). Called on the main process."""
    path = run_dir / WANDB_RUN_ID
    if resume == "latest" and wandb_mode(cfg) == "online" and path.is_file():
        return {"id": path.read_text(encoding="utf-8").strip(), "resume": "allow"}
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    write_text_atomically(path, run_id)
    return {"id": run_id}


def wandb_init_kwargs(cfg: LoggerConfig, run_dir: Path, resume: str | None = None) -> dict:
    """``wandb.init``'s arguments: the run lives in the run folder (``run_dir/wandb``, so an offline run is synced
    from there), is named after it and continued by a resume (``which_wandb_run``); ``mode`` only when ``logger.mode``
    is set, so that ``WANDB_MODE`` decides."""
    kwargs = {
        **which_wandb_run(cfg, run_dir, resume),
        "dir": str(run_dir),
        "name": cfg.run_name or run_dir.name,
        "entity": cfg.entity,
        "group": cfg.group,
        "tags": list(cfg.tags) or None,
        "notes": cfg.notes,
    }
    return kwargs | ({"mode": cfg.mode} if cfg.mode else {})


def start_trackers(accelerator: Accelerator, cfg: LoggerConfig, run_dir: Path, config: dict) -> None:
    """Start the tracker with the run's whole config (``config``, as a dict: the trackers' hyperparameters, and its
    ``privacy`` says what they may get; its ``trainer.resume`` may continue the folder's W&B run) and the run
    folder's path (``run_dir``)."""
    if tracker_name(cfg) is None:
        return
    wandb_kwargs = cfg.name == "wandb" and accelerator.is_main_process
    init_kwargs = {"wandb": wandb_init_kwargs(cfg, run_dir, config["trainer"]["resume"])} if wandb_kwargs else {}
    values = {**flat_config(config), "run_dir": str(run_dir.resolve())}
    # W&B's own errors (no network, a refused key, a project it may not write to) are the user's to fix
    user_errors = (importlib.import_module("wandb").errors.Error,) if cfg.name == "wandb" else ()
    try:
        accelerator.init_trackers(cfg.project, config=values, init_kwargs=init_kwargs)
    except user_errors as error:
        reason = " ".join(str(error).split())
        raise ConfigError("logger", "wandb", f"W&B could not start the run ({reason})", OFFLINE_FIX) from error
    withhold_private_metrics(accelerator, PrivacyConfig(**config.get("privacy", {})))
