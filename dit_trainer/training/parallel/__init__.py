"""How a step spreads over processes and memory: FSDP2 (``fsdp``), DP-SGD's per-sample clipping (``privacy``) and the
memory estimate checked before step 1 (``memory``)."""
