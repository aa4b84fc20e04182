"""``scripts/export.py ... push_to_hub=REPO``: the export, then its upload to the Hugging Face Hub with
``huggingface_hub`` (``HfApi.create_repo`` and ``upload_folder``).

What can be known before anything is exported or uploaded is checked first, each refusal one paragraph: the Hub
is unreachable by choice (``HF_HUB_OFFLINE=1``), the repository id is malformed, or no token is configured
(``HF_TOKEN`` or ``hf auth login``). An upload that fails later (network, permissions) leaves the complete export
in place and says how to upload it again.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from dit_trainer.apps.export import export_run
from dit_trainer.config import ExportConfig
from dit_trainer.errors import ConfigError, require
from dit_trainer.hub import hub_offline

UPLOAD_LATER = "export without `push_to_hub` and upload the folder later with `hf upload {repo} FOLDER`"


def check_hub_push(repo: str) -> None:
    """Refuse ``push_to_hub=repo`` when nothing could be uploaded: offline, a malformed id, no token."""
    later = UPLOAD_LATER.format(repo=repo)
    require(
        not hub_offline(),
        "push_to_hub",
        repo,
        "HF_HUB_OFFLINE=1 is set, so nothing can be uploaded to the Hub",
        f"unset HF_HUB_OFFLINE on a machine with Hub access, or {later}",
    )
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ConfigError(
            "push_to_hub", repo, f"it is not a Hub repository id ({error})", "pass `push_to_hub=user/name`"
        ) from error
    require(
        get_token() is not None,
        "push_to_hub",
        repo,
        "no Hugging Face token is configured (neither HF_TOKEN nor a saved login), and uploading needs one",
        f"run `hf auth login` (or set HF_TOKEN to a token with write access), or {later}",
    )


def push_folder(folder: Path, repo: str, private: bool) -> str:
    """Upload ``folder`` to the model repository ``repo`` (created if need be, ``private`` then); its URL."""
    api = HfApi()
    try:
        url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=url.repo_id, folder_path=folder, commit_message=f"Upload {folder.name} (dit-trainer)")
    except Exception as error:  # HTTP errors, and the network's (httpx), which are not OSErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            "push_to_hub",
            repo,
            f"the upload failed ({reason}); the export itself is complete in {folder}",
            f"check the network and the token's write access to {repo}, then run `hf upload {repo} {folder}`",
        ) from error
    return str(url)


def export_and_push(cfg: ExportConfig) -> str:
    """``scripts/export.py``: the export (with its model card), uploaded when ``push_to_hub`` names a repository;
    the message to print."""
    if cfg.push_to_hub:
        check_hub_push(cfg.push_to_hub)
    result = export_run(cfg)
    if not cfg.push_to_hub:
        return result.message
    url = push_folder(result.out_dir, cfg.push_to_hub, cfg.hub_private)
    return f"{result.message}\n\nUploaded to {url} ({'private' if cfg.hub_private else 'public'})."
