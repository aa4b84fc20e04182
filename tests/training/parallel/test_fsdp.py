"""What a sharded launch refuses (``training/parallel/fsdp.py``, ``training/parallel/privacy.py``) and a resume on
another number of processes where the checkpoint holds per-process state (``training/state/checkpoint.py``), and the
wrap units it gives FSDP. The sharded runs themselves: ``tests/e2e/test_fsdp.py`` and
``tests/e2e/test_fsdp_families.py``."""

import json
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.components.families import FAMILIES
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.errors import ConfigError
from dit_trainer.training.parallel.fsdp import check_fsdp, wrap_family_blocks
from dit_trainer.training.parallel.privacy import check_private_launch
from dit_trainer.training.state.checkpoint import Checkpointer
from dit_trainer.training.state.checkpoint_manifest import ResumeRules
from dit_trainer.training.state.training_state import TrainingState
from tests.conftest import one_paragraph


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
                                None, None, ResumeRules(same_processes_because=because))  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        checkpointer.restore(str(checkpoint))
    message = one_paragraph(caught.value, "trainer.resume")
    assert "written by 2 processes and this run has 1" in message and because in message


def tiny_dit(family: str, classes: int = 10) -> DiTAdapter:
    """A 2-block transformer of ``family`` (the DiT: 10 classes; PixArt: 16-dim text)."""
    cfg = ModelConfig(family=family, num_layers=2, num_attention_heads=2, attention_head_dim=8, patch_size=2)
    return DiTAdapter(FAMILIES.get(family).build(cfg, 4, 8, ConditionSize(classes if family == "dit" else 16)),
                      FAMILIES.get(family))  # fmt: skip


def wrap_units(dit: DiTAdapter, **plugin) -> list[str]:
    """The classes FSDP wraps in ``dit`` under an accelerate FSDP2 config of ``plugin``'s settings."""
    fsdp = FullyShardedDataParallelPlugin(fsdp_version=2, **plugin)
    wrap_family_blocks(SimpleNamespace(is_fsdp2=True, state=SimpleNamespace(fsdp_plugin=fsdp)), dit)
    return fsdp.transformer_cls_names_to_wrap


def test_a_module_the_blocks_share_is_a_wrap_unit_of_its_own():
    named = {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["BasicTransformerBlock"]}
    dit = tiny_dit("dit")
    assert dit.shared_modules() == [dit.transformer.transformer_blocks[1].norm1.emb]  # block 0's, used by all
    assert wrap_units(dit, **named) == ["BasicTransformerBlock", "CombinedTimestepLabelEmbeddings"]
    assert wrap_units(dit, auto_wrap_policy="transformer_based_wrap") == wrap_units(dit, **named)  # none named
    assert wrap_units(tiny_dit("pixart_alpha"), **named) == ["BasicTransformerBlock"]  # nothing shared


def test_size_based_wrapping_of_shared_modules_is_refused():
    with pytest.raises(ConfigError) as caught:
        wrap_units(tiny_dit("dit"), auto_wrap_policy="size_based_wrap", min_num_params=1000)
    assert "TRANSFORMER_BASED_WRAP" in one_paragraph(caught.value, "fsdp_config.fsdp_auto_wrap_policy")
    wrap_units(tiny_dit("pixart_alpha"), auto_wrap_policy="size_based_wrap", min_num_params=1000)  # nothing shared
