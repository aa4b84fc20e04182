"""What a sharded launch refuses (``training/fsdp.py``, ``training/privacy.py``) and a resume on another number of
processes where the checkpoint holds per-process state (``training/checkpoint.py``). The sharded runs themselves:
``tests/e2e/test_fsdp.py``."""

import json
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from dit_trainer.errors import ConfigError
from dit_trainer.training.checkpoint import Checkpointer, TrainingState
from dit_trainer.training.fsdp import check_fsdp
from dit_trainer.training.privacy import check_private_launch

from ..conftest import one_paragraph


def launch_state(version: int) -> SimpleNamespace:
    """What the checks read of an accelerator launched with FSDP ``version``."""
    return SimpleNamespace(distributed_type=DistributedType.FSDP, is_fsdp2=version == 2, num_processes=2,
                           mixed_precision="no")  # fmt: skip


def test_fsdp1_is_refused_and_fsdp2_accepted():
    check_fsdp(launch_state(2))
    with pytest.raises(ConfigError) as caught:
        check_fsdp(launch_state(1))
    assert "fsdp_version: 2" in one_paragraph(caught.value, "fsdp_config.fsdp_version")


def test_dp_is_refused_under_fsdp():
    with pytest.raises(ConfigError) as caught:
        check_private_launch(launch_state(2))
    assert "shards them with FSDP" in one_paragraph(caught.value, "privacy.enabled")


def test_a_resume_on_another_number_of_processes_is_refused_where_state_is_per_process(tmp_path):
    checkpoint = tmp_path / "checkpoints" / "checkpoint-4"
    (checkpoint / "transformer").mkdir(parents=True)
    (checkpoint / "manifest.json").write_text(json.dumps({"step": 4, "world_size": 2, "files": {}}))
    because = "a streamed source resumes from the shard position each process recorded"
    checkpointer = Checkpointer(Accelerator(cpu=True), tmp_path / "checkpoints", TrainingState(torch.Generator()),
                                None, None, same_processes_because=because)  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        checkpointer.restore(str(checkpoint))
    message = one_paragraph(caught.value, "trainer.resume")
    assert "written by 2 processes and this run has 1" in message and because in message
