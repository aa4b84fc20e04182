"""PixArt's adaLN-single modulation tables moved into modules (``components/modulation.py``), where per-sample
gradient code sees them: the outputs and the diffusers state dict stay the same; a DiT embedder that every block
calls runs once per forward."""

import copy

import torch

from dit_trainer.components.modulation import embed_once_per_forward, expose_modulation_tables
from dit_trainer.condition import Condition

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


def test_an_embedder_called_by_every_block_runs_once_per_forward(tiny_transformer):
    """Under DP the DiT's shared embedder (called by its 3 blocks and its output layer) computes once per forward:
    the same outputs and state dict, weights changed between forwards are seen, and a deep copy (the EMA) runs its
    own embedder."""
    plain = tiny_transformer("dit", condition_dim=10, num_layers=3)
    once = copy.deepcopy(plain)
    assert embed_once_per_forward(once.transformer, [b.norm1.emb for b in once.transformer.transformer_blocks]) == 1
    calls = []
    for name, model in (("plain", plain), ("once", once)):
        linear = model.transformer.transformer_blocks[0].norm1.emb.timestep_embedder.linear_1
        linear.register_forward_hook(lambda *_, name=name: calls.append(name))
    x, t, labels = torch.randn(2, 4, 8, 8), torch.tensor([10, 900]), Condition(torch.tensor([3, 10]), torch.ones(2, 1))
    torch.testing.assert_close(once(x, t, labels), plain(x, t, labels), rtol=0, atol=0)
    assert calls.count("plain") == 4 and calls.count("once") == 1
    assert once.state_dict().keys() == plain.state_dict().keys()
    for model in (plain, once):
        with torch.no_grad():
            model.transformer.transformer_blocks[0].norm1.emb.class_embedder.embedding_table.weight.add_(1.0)
    torch.testing.assert_close(once(x, t, labels), plain(x, t, labels), rtol=0, atol=0)
    copied = copy.deepcopy(once)
    embedder = copied.transformer.transformer_blocks[0].norm1.emb
    assert embedder.forward.compute.__self__ is embedder  # the copy's memo calls the copy's embedder
    with torch.no_grad():
        embedder.class_embedder.embedding_table.weight.add_(1.0)
    assert not torch.equal(copied(x, t, labels), once(x, t, labels))
    assert embedder.forward.memo is None  # forgotten after the forward: no tensors kept
