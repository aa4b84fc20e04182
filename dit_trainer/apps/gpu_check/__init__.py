"""``scripts/gpu_check.sh``: what a GPU machine lent for half an hour should measure, in one command.

Every measurement (a "row") runs in a subprocess of its own, so that its peak memory is its own and its failure
(an OOM, a crash, a refusal) is recorded while the other rows go on. ``plan`` says which rows this machine runs,
``rows`` runs them and writes ``gpu_check.json`` and ``gpu_check.md``, ``throughput`` is what a throughput row's
subprocess runs, ``assets`` the tiny random models and data the training rows use, ``peak`` the GPUs' peak FLOP/s.
"""
