"""Parameter breakdown and step changes (``diagnostics/parameters.py``)."""

import torch

from dit_trainer.diagnostics.parameters import count_parameters, format_parameter_table, snapshot, step_changes


def test_parameter_table_and_step_changes():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    count = count_parameters("dit", model)
    assert (count.trainable, count.frozen, count.total) == (10, 16, 26)
    assert "38.46" in format_parameter_table([count])
    before = snapshot(model)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # a frozen parameter moved; the trainable ones did not
    changes = step_changes(model, before, prefix="dit.")
    assert changes.changed_frozen == ["dit.0.weight"]
    assert changes.unchanged_trainable == ["dit.1.weight", "dit.1.bias"] and not changes.ok
