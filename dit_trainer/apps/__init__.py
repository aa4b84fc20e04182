"""Applications over a run and its models, each behind a script or `train.py`'s helpers: sampling and evaluating a
run (``inference``, ``evaluation``, ``preview``), exporting it to diffusers and the hub (``export``, ``export_lora``,
``model_card``, ``hub_push``), precomputing a data cache (``precompute``), measuring speed (``benchmark``,
``loader_benchmark``, ``gpu_check/``), checking a run's claims (``verification``) and the command-line helpers
(``cli``). Nothing below this package imports it."""
