"""Several ``train.py`` runs in turn in the processes of one launch, for tests that need many short multi-process
runs: each process of ``python -m accelerate.commands.launch ... -m tests.e2e.runs_in_turn PLAN`` reads PLAN (a JSON
object: a run's name -> its command line, ``train.py``'s overrides), runs them in that order as ``train.py`` runs
one (its ``command_line`` and ``main``), and prints ``run NAME rank R: exit CODE`` after each (``ended`` reads them
back). A launch costs each process its interpreter and imports, about 15 s on 2 cores: runs that share one pay
them once. A run that fails on every process lets the next one start; one that fails on some only ends the launch
(the others stop with its failure, as in any multi-process run)."""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
from pathlib import Path

from accelerate.state import PartialState

from dit_trainer.runs.process_exit import exit_without_finalizing

from ..conftest import REPO, exit_code_of, forget_the_run, logging_restored, run_script

OUTCOME = re.compile(r"^run (\S+) rank (\d+): exit (-?\d+)$", re.MULTILINE)


def run_in_turn(plan: dict[str, list[str]]) -> None:
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())  # one stream, in order: a failure's traceback within its run
    sys.stdout.reconfigure(line_buffering=True)
    train = runpy.run_path(str(REPO / "train.py"), run_name="train")  # its functions, not its __main__ block
    train["main"].__wrapped__.__module__ = "__main__"  # so that Hydra finds configs/ beside train.py, as when run
    rank = os.environ.get("RANK", "0")
    # One world for the whole launch: each run's end leaves its process group to the next run. A world destroyed and
    # made again does not work: its gloo rendezvous reads the last one's keys from the launcher's store (a hang),
    # and with the groups numbered apart, a mesh of the last run reached the next ("Could not resolve the process
    # group registered under the name 0"; torch's DTensor caches compare meshes by shape, not by group).
    PartialState.destroy_process_group = lambda self, group=None: None
    for name, argv in plan.items():
        print(f"=== run {name} rank {rank}", flush=True)
        code = exit_code_of(lambda argv=argv: run_once(train, argv))
        forget_the_run()  # the next run's Accelerator starts from its own settings (in the same world)
        print(f"run {name} rank {rank}: exit {code}", flush=True)


def run_once(train: dict, argv: list[str]) -> None:
    """``train.py argv`` as its ``__main__`` block runs it, with ``train`` its functions."""
    sys.argv = ["train.py", *train["command_line"](argv)]
    with logging_restored():
        train["main"]()


def launch_in_turn(launcher: list[str], plan: dict[str, list[str]], plan_file: Path, env: dict[str, str]) -> str:
    """The runs of ``plan`` in one launch (``launcher``: the arguments before the script, as ``run_script`` takes
    them), the plan written to ``plan_file``; returns what every process printed."""
    plan_file.write_text(json.dumps(plan))
    result = run_script([*launcher, "-m", "tests.e2e.runs_in_turn", str(plan_file)], timeout=1500, env=env)
    return result.stdout + result.stderr


def ended(output: str, name: str, code: int = 0, processes: int = 2) -> str:
    """What the processes printed during run ``name`` of a launch's ``output``, after checking that it ended with
    exit ``code`` on each of them."""
    outcomes = [match for match in OUTCOME.finditer(output) if match.group(1) == name]
    found = {int(match.group(2)): int(match.group(3)) for match in outcomes}
    start = re.search(rf"^=== run {re.escape(name)} rank", output, re.MULTILINE)
    printed = output[start.start() if start else 0 : max((match.end() for match in outcomes), default=None)]
    assert found == dict.fromkeys(range(processes), code), f"run {name}: exit codes {found}\n{printed[-6000:]}"
    return printed


if __name__ == "__main__":
    run_in_turn(json.loads(Path(sys.argv[1]).read_text()))
    exit_without_finalizing()  # as train.py's processes end: no teardown that can hang the launch
