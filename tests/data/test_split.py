"""The validation split (``data/split.py``): seeded, disjoint and complete."""

from dit_trainer.data.split import split_indices


def test_the_split_is_seeded_disjoint_and_complete():
    train_ids, held = split_indices(100, 0.1, seed=3)
    assert (train_ids, held) == split_indices(100, 0.1, seed=3)
    assert held != split_indices(100, 0.1, seed=4)[1]
    assert len(held) == 10 and not set(train_ids) & set(held) and sorted(train_ids + held) == list(range(100))
    assert len(split_indices(10, 0.001, 0)[1]) == 1 and len(split_indices(10, 0.999, 0)[0]) == 1
