"""PixArt's adaLN-single modulation tables moved into modules (``components/modulation.py``), where per-sample
gradient code sees them: the outputs and the diffusers state dict stay the same."""

import torch

from dit_trainer.components.modulation import expose_modulation_tables

from ..conftest import TINY_CONDITION_DIM, tiny_batch


def test_moved_modulation_tables_keep_outputs_and_diffusers_state_dict(tiny_transformer):
    plain, exposed = (
        tiny_transformer(condition_dim=TINY_CONDITION_DIM),
        tiny_transformer(condition_dim=TINY_CONDITION_DIM),
    )
    moved = expose_modulation_tables(exposed.transformer)
    assert moved == ["transformer_blocks.0.scale_shift_table", "transformer_blocks.1.scale_shift_table",
                     "scale_shift_table"]  # fmt: skip
    x, t, condition, _ = tiny_batch()
    torch.testing.assert_close(exposed(x, t, condition), plain(x, t, condition), atol=1e-6, rtol=0)
    expected = plain.state_dict()
    saved = exposed.state_dict()
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[key], expected[key]) for key in expected)
    with torch.no_grad():  # a diffusers state dict loads into the moved tables
        plain.transformer.scale_shift_table.add_(1.0)
    exposed.load_state_dict(plain.state_dict())
    assert torch.equal(exposed.transformer.output_modulation.table, plain.transformer.scale_shift_table)
