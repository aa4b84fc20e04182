"""The run's counters and data position (``training/state/training_state.py``): saved, restored, and read from
checkpoints written before the position was kept."""

import torch
from safetensors.torch import save_file

from dit_trainer.training.state.training_state import DataPosition, TrainingState


def test_the_counters_and_the_data_position_come_back_on_every_process(tmp_path):
    saved = TrainingState(torch.Generator().manual_seed(3))
    saved.step, saved.skipped_steps, saved.monitors_pending = 9, 1, True
    saved.data_position = DataPosition(epoch=1, batches=3, images_per_batch=8, batch_size=4)
    saved.save(tmp_path / "trainer_state_0.safetensors")
    for process in (0, 1):  # process 1: resumed on more processes than wrote the checkpoint
        restored = TrainingState(torch.Generator())
        restored.load(tmp_path, process)
        assert (restored.step, restored.skipped_steps, restored.monitors_pending) == (9, 1, True)
        assert restored.data_position == DataPosition(1, 3, 8, 4)


def test_a_load_forgets_what_a_failed_load_before_it_left(tmp_path):
    """A checkpoint that fails to load after its state (another file is damaged) is passed over for an older one:
    the log window must be the older one's, not a mix (the timestep buckets hold the same dict)."""
    saved = TrainingState(torch.Generator())
    saved.save(tmp_path / "trainer_state_0.safetensors")  # nothing since the last log
    state = TrainingState(torch.Generator())
    window = state.since_log
    window["loss"] = torch.tensor([1.0, 2.0])  # what the failed load put there
    state.load(tmp_path, 0)
    assert state.since_log is window and window == {}


def test_a_checkpoint_from_before_the_data_position_has_none(tmp_path):
    generator = torch.Generator()
    counters = torch.tensor([6, 0, 0, 0], dtype=torch.int64)
    save_file({"counters": counters, "generator": generator.get_state()}, tmp_path / "trainer_state_0.safetensors")
    state = TrainingState(torch.Generator())
    state.load(tmp_path, 0)
    assert state.step == 6 and state.data_position is None


def test_a_position_in_other_batches_is_the_same_image_of_the_same_epoch():
    position = DataPosition(epoch=2, batches=5, images_per_batch=6, batch_size=6)  # 30 images into epoch 2
    assert position.micro_steps(batches_per_epoch=10, images_per_batch=6) == 25
    assert position.micro_steps(batches_per_epoch=5, images_per_batch=12) == 12  # 24 images: 6 are read again
    assert position.micro_steps(batches_per_epoch=4, images_per_batch=4) == 12  # past this batching's epoch: its end


def test_what_the_next_log_step_averages_comes_back_to_its_own_process_only(tmp_path):
    """The losses since the last log are each process's own: a process the checkpoint did not have starts empty."""
    saved = TrainingState(torch.Generator())
    saved.since_log["loss"] = torch.tensor([1.5, 2.5])
    saved.since_log["loss_by_timestep"] = torch.ones(2, 10)
    saved.save(tmp_path / "trainer_state_0.safetensors")
    restored, newcomer = TrainingState(torch.Generator()), TrainingState(torch.Generator())
    restored.load(tmp_path, 0)
    newcomer.load(tmp_path, 1)
    assert torch.equal(restored.since_log["loss"], torch.tensor([1.5, 2.5]))
    assert torch.equal(restored.since_log["loss_by_timestep"], torch.ones(2, 10)) and newcomer.since_log == {}
