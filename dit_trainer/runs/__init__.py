"""A run's folder and process, below everything that trains: its layout and checkpoints list (``run_folder``), the
lock one launch holds on it (``run_lock``), the checks of a launch into it and what a refused one undoes
(``launch_folder``), its summary and failure records (``run_summary``, ``failures``), a new run's starting weights
from another run (``init_run``) and how a launch's processes end (``process_exit``)."""
