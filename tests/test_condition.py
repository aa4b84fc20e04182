"""``Condition``: the seam between conditioners and families. Rows select, concatenate, mix and store alike for every
field, a missing pooled vector stays missing, and DDP's input handling sees its tensors."""

import pytest
import torch
from torch.distributed.utils import _recursive_to

from dit_trainer.condition import Condition


def condition(rows: int, pooled: bool = True, offset: float = 0.0) -> Condition:
    sequence = torch.arange(rows * 3 * 2, dtype=torch.float32).reshape(rows, 3, 2) + offset
    mask = torch.ones(rows, 3, dtype=torch.long)
    return Condition(sequence, mask, sequence.sum(1) if pooled else None)


@pytest.mark.parametrize("pooled", [True, False])
def test_rows_cat_expand_and_where_act_on_every_field_alike(pooled):
    a, empty = condition(4, pooled), condition(1, pooled, offset=100.0)
    picked = a.rows(torch.tensor([2, 0]))
    assert torch.equal(picked.sequence, a.sequence[[2, 0]]) and picked.batch_size == 2
    both = Condition.cat([a, empty.expand(4)])
    assert both.batch_size == 8 and torch.equal(both.sequence[4:], empty.sequence.expand(4, 3, 2))
    keep = torch.tensor([True, False, True, False])
    mixed = a.where(keep, empty)
    for field in ("sequence", "mask", "pooled"):
        mine, theirs, got = getattr(a, field), getattr(empty, field), getattr(mixed, field)
        if not pooled and field == "pooled":
            assert got is None
            continue
        assert torch.equal(got[0], mine[0]) and torch.equal(got[1], theirs[0]) and torch.equal(got[2], mine[2])


def test_cast_leaves_masks_and_class_ids_integers():
    labels = Condition(torch.tensor([3, 1]), torch.ones(2, 1, dtype=torch.long))
    assert labels.cast(torch.bfloat16).sequence.dtype == torch.long
    cast = condition(2).cast(torch.bfloat16)
    assert cast.sequence.dtype == cast.pooled.dtype == torch.bfloat16 and cast.mask.dtype == torch.long


def test_stored_round_trips_with_and_without_a_pooled_vector():
    for pooled in (True, False):
        original = condition(2, pooled)
        stored = original.stored("text_")
        assert ("text_pooled" in stored) == pooled and set(stored) >= {"text_embeds", "text_mask"}
        back = Condition.from_stored(stored, "text_")
        assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(back, original))
    assert Condition.from_stored({"caption": ["a"]}, "text_") is None


def test_stack_of_single_rows_is_the_batch():
    a = condition(3)
    stacked = Condition.stack([a.rows(i) for i in range(3)])
    assert all(torch.equal(x, y) for x, y in zip(stacked, a))


def test_ddp_moves_its_tensors_as_a_named_tuple():
    """DDP and FSDP move a forward's inputs with ``_recursive_to``, which recurses into named tuples (not into
    dataclasses): a Condition arrives whole, its None field kept."""
    ((moved,),) = _recursive_to((condition(2, pooled=False),), torch.device("cpu"), False)  # [(inputs...)]
    assert isinstance(moved, Condition) and moved.pooled is None and torch.equal(moved.mask, torch.ones(2, 3))
