"""The cluster launch files: accelerate configs (accelerate_configs/) and Slurm scripts (scripts/slurm/).

No GPU or Slurm here, so: the configs are read by accelerate's own loader and launch-argument code; the FSDP
settings wrap a tiny PixArt with torch FSDP on two CPU ranks (accelerate 1.15 will not run FSDP on a CPU: it falls
back to DDP, see test_fsdp_settings_train_and_checkpoint_on_cpu); and the sbatch scripts run under bash with stand-in
`srun`, `scontrol` and `accelerate` commands (the last one runs the real `accelerate launch` on CPU) to check that
SIGUSR1 reaches the training ranks, that no rank is killed while it checkpoints, and that the job requeues itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]  # not from conftest: this file also runs as a torch.distributed worker
ACCELERATE_CONFIGS = REPO / "accelerate_configs"
SLURM_SCRIPTS = REPO / "scripts" / "slurm"

EXPECTED = {  # file -> (distributed type, processes, machines, mixed precision)
    "single_gpu": ("NO", 1, 1, "bf16"),
    "ddp_8gpu": ("MULTI_GPU", 8, 1, "bf16"),
    "fsdp": ("FSDP", 8, 1, "bf16"),
    "fsdp_cpu": ("FSDP", 2, 1, "no"),  # its runs: tests/e2e/test_fsdp.py
    "multi_node": ("MULTI_GPU", 16, 2, "bf16"),
}


def load_accelerate_config(name: str):
    """What `accelerate launch --config_file` reads (accelerate.commands.launch calls this loader)."""
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))


def launch_args(name: str, *extra: str):
    """`accelerate launch --config_file <name> ...` arguments after accelerate's own validation and defaults
    (private accelerate API: the same calls `accelerate launch` makes)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(
        ["--config_file", str(ACCELERATE_CONFIGS / f"{name}.yaml"), *extra, "train.py", "+experiment=dit"]
    )
    return _validate_launch_command(args)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_config_is_tested():
    assert sorted(p.stem for p in ACCELERATE_CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import ClusterConfig

    config = load_accelerate_config(name)
    distributed_type, processes, machines, mixed_precision = EXPECTED[name]
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == distributed_type
    assert (config.num_processes, config.num_machines) == (processes, machines)
    assert config.mixed_precision == mixed_precision
    assert not config.use_cpu
    first_line = (ACCELERATE_CONFIGS / f"{name}.yaml").read_text().splitlines()[0]
    assert first_line.startswith("# accelerate config:")


def test_launch_reads_the_configs():
    single = launch_args("single_gpu")
    assert not (single.multi_gpu or single.use_fsdp) and single.num_processes == 1
    ddp = launch_args("ddp_8gpu")
    assert ddp.multi_gpu and ddp.num_processes == 8 and ddp.mixed_precision == "bf16"
    fsdp = launch_args("fsdp")
    assert fsdp.use_fsdp and fsdp.num_processes == 8


def test_multi_node_takes_rank_and_address_from_the_command_line():
    from accelerate.utils.launch import prepare_multi_gpu_env

    assert load_accelerate_config("multi_node").main_process_ip is None  # must come from the command line
    args = launch_args("multi_node", "--machine_rank", "1", "--main_process_ip", "10.0.0.7")
    prepare_multi_gpu_env(args)  # what `accelerate launch` hands torchrun
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert args.rdzv_endpoint == "10.0.0.7:29500"


def fsdp_launch_env(name: str) -> dict[str, str]:
    """The FSDP_* environment `accelerate launch --config_file accelerate_configs/<name>.yaml` gives each rank."""
    from accelerate.utils.launch import prepare_multi_gpu_env

    env = prepare_multi_gpu_env(launch_args(name, "--main_process_port", str(free_port())))
    return {k: v for k, v in env.items() if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP"}


@pytest.mark.parametrize("name", ["fsdp", "fsdp_cpu"])
def test_fsdp_configs_are_fsdp2_with_sharded_checkpoints(name):
    config = load_accelerate_config(name).fsdp_config
    assert config["fsdp_version"] == 2
    assert config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert config["fsdp_cpu_ram_efficient_loading"] is False
    env = fsdp_launch_env(name)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    assert env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT"


def test_fsdp_wrap_class_is_the_pixart_block(tiny_transformer):
    import diffusers.models.attention

    name = load_accelerate_config("fsdp").fsdp_config["fsdp_transformer_layer_cls_to_wrap"]
    block_class = getattr(diffusers.models.attention, name)
    model = tiny_transformer(learned_sigma=True).transformer
    assert all(type(block) is block_class for block in model.transformer_blocks)


@pytest.mark.parametrize("script", sorted(SLURM_SCRIPTS.glob("*.sbatch")), ids=lambda p: p.name)
def test_sbatch_script_syntax(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "#SBATCH --signal=" in text and "#SBATCH --requeue" in text and "scontrol requeue" in text
    assert "trainer.resume=latest" in text and "hydra.run.dir=" in text


# Stand-ins for a Slurm node. `accelerate` records its arguments, then runs the real `accelerate launch` (torchrun's
# elastic agent, on CPU) over two ranks that stop like the trainer: on SIGUSR1 they finish their work, rank 0
# taking longer (checkpoint, trackers), and exit 3; a SIGTERM in that time would kill them.
WORKER = """
import os, signal, sys, time
mark, name, launcher = os.environ["MARK"], os.environ["NODE"] + "." + os.environ["RANK"], os.getppid()
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
open(f"{mark}/ready.{name}", "w").close()
if os.environ.get("WORKER_FAILS") and os.environ["RANK"] == "1":  # a user error, recorded as train.py does
    from pathlib import Path
    from dit_trainer.runs.failures import record_failure
    Path(os.environ["RUN_DIR"]).mkdir(parents=True, exist_ok=True)
    record_failure(Path(os.environ["RUN_DIR"]), int(os.environ["WORKER_FAILS"]), "planted")
    sys.exit(int(os.environ["WORKER_FAILS"]))
deadline = time.time() + float(os.environ["WORKER_SECONDS"])
while not got and time.time() < deadline:
    time.sleep(0.02)
if got:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(1.5 if os.environ["RANK"] == "0" else 0.2)
    with open(f"{mark}/usr1.{name}", "w") as f:
        f.write("launcher alive" if os.getppid() == launcher else "orphaned")
sys.exit(3 if got else 0)
"""
FAKE_ACCELERATE = """#!/bin/bash
printf '%s\\n' "$@" > "$MARK/accelerate.${SLURM_NODEID:-0}.args"
export NODE=${SLURM_NODEID:-0} ACCELERATE_USE_CPU=1
exec "$REAL_ACCELERATE" launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
    --dynamo_backend no --main_process_port 0 "$MARK/worker.py"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$MARK/scontrol.log"
if [ "$1 $2" = "show hostnames" ]; then tr ',' '\\n' <<< "$3"; fi
"""
FAKE_SRUN = """#!/bin/bash
# One task per node. Like srun, relay SIGUSR1 to the tasks, and only to them: proctrack/cgroup (Slurm's usual
# process tracking) sends signals other than SIGKILL to the direct children of slurmstepd only, not to what they
# start. Exit with the highest task status.
while [[ $1 == --* ]]; do shift; done
pids=()
for ((n = 0; n < SLURM_NNODES; n++)); do SLURM_NODEID=$n "$@" & pids+=($!); done
trap 'kill -USR1 "${pids[@]}"' USR1
rc=0
for p in "${pids[@]}"; do
    while :; do wait "$p"; s=$?; kill -0 "$p" 2>/dev/null || break; done
    if [ "$s" -gt "$rc" ]; then rc=$s; fi
done
exit "$rc"
"""


def run_sbatch(tmp_path: Path, script: str, nodes: int, warn: bool, fail: int | None = None) -> tuple[int, Path, str]:
    """Run a sbatch script as Slurm would on the batch node; with ``warn``, send SIGUSR1 to the batch shell (what
    ``--signal=B:USR1@120`` does) once every rank is up; with ``fail``, rank 1 fails with that exit code. Returns
    the exit code, the marker folder and the log."""
    mark, venv_bin = tmp_path / "mark", tmp_path / "venv" / "bin"
    mark.mkdir()
    venv_bin.mkdir(parents=True)
    (mark / "worker.py").write_text(WORKER)
    (venv_bin / "activate").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    for name, text in {"accelerate": FAKE_ACCELERATE, "scontrol": FAKE_SCONTROL, "srun": FAKE_SRUN}.items():
        (venv_bin / name).write_text(text)
        (venv_bin / name).chmod(0o755)
    env = {
        **os.environ,
        "VENV": str(tmp_path / "venv"),
        "MARK": str(mark),
        "REAL_ACCELERATE": str(Path(sys.executable).with_name("accelerate")),
        "OMP_NUM_THREADS": "1",
        "WORKER_SECONDS": "20" if warn else "0.5",
        "WORKER_FAILS": str(fail or ""),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # `python` with this package
        "RUN_DIR": str(tmp_path / "run"),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "dit-test",
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": ",".join(f"node{i}" for i in range(nodes)),
    }
    env.pop("SLURM_GPUS_ON_NODE", None)
    log = tmp_path / "job.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", str(SLURM_SCRIPTS / script), "data.path=/data/x"], cwd=REPO, env=env, stdout=out, stderr=out
        )
    try:
        if warn:
            deadline = time.time() + 60
            while len(list(mark.glob("ready.*"))) < 2 * nodes:
                assert time.time() < deadline and process.poll() is None, "the ranks did not start"
                time.sleep(0.1)
            process.send_signal(signal.SIGUSR1)
        return process.wait(timeout=90), mark, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()


def usr1_received(mark: Path) -> dict[str, str]:
    """Which ranks got SIGUSR1, and whether their launcher was still alive when they exited."""
    return {p.name: p.read_text() for p in sorted(mark.glob("usr1.*"))}


@pytest.mark.slow
@pytest.mark.parametrize("warn", [True, False], ids=["time-limit-warning", "finishes"])
def test_single_node_sbatch_forwards_usr1_and_requeues(tmp_path, warn):
    rc, mark, log = run_sbatch(tmp_path, "train_single_node.sbatch", nodes=1, warn=warn)
    args = (mark / "accelerate.0.args").read_text().splitlines()
    assert args[:3] == ["launch", "--config_file", "accelerate_configs/ddp_8gpu.yaml"]
    assert ["trainer.resume=latest", f"hydra.run.dir={tmp_path / 'run'}", "data.path=/data/x"] == args[-3:]
    if warn:
        assert usr1_received(mark) == {"usr1.0.0": "launcher alive", "usr1.0.1": "launcher alive"}, log
        assert (mark / "scontrol.log").read_text().splitlines() == ["requeue 4242"]
        assert rc == 1  # torchrun's agent exits 1 after forwarding a signal, whatever its ranks returned
    else:
        assert not usr1_received(mark) and not (mark / "scontrol.log").exists()
        assert rc == 0


@pytest.mark.slow
def test_the_job_exits_with_the_code_a_failed_rank_recorded_not_the_launcher_s(tmp_path):
    rc, mark, log = run_sbatch(tmp_path, "train_single_node.sbatch", nodes=1, warn=False, fail=5)
    assert "exitcode  : 5" in log  # the launcher saw it, and exited 1
    assert rc == 5 and not (mark / "scontrol.log").exists()  # not mistaken for a preemption either


@pytest.mark.slow
def test_multi_node_sbatch_forwards_usr1_to_every_node_and_requeues(tmp_path):
    rc, mark, log = run_sbatch(tmp_path, "train_multi_node.sbatch", nodes=2, warn=True)
    ranks = ["usr1.0.0", "usr1.0.1", "usr1.1.0", "usr1.1.1"]
    assert usr1_received(mark) == dict.fromkeys(ranks, "launcher alive"), log
    for node in (0, 1):
        args = (mark / f"accelerate.{node}.args").read_text().splitlines()
        joined = " ".join(args)
        assert "--config_file accelerate_configs/multi_node.yaml" in joined
        assert f"--machine_rank {node}" in joined and "--main_process_ip node0" in joined
        assert "--num_machines 2 --num_processes 16" in joined
        assert args[-3:] == ["trainer.resume=latest", f"hydra.run.dir={tmp_path / 'run'}", "data.path=/data/x"]
    assert (mark / "scontrol.log").read_text().splitlines()[-1] == "requeue 4242"
    assert rc == 1  # the agents exit 1 after forwarding a signal; the script requeued because it forwarded one


@pytest.mark.parametrize("script", sorted((REPO / "scripts" / "slurm").glob("*.sbatch")), ids=lambda p: p.stem)
def test_each_submission_gets_its_own_run_folder_and_a_requeue_the_same(script):
    """Two jobs with one name must not share a run folder (they would replace each other's checkpoints); the
    requeue of a job keeps its id and so resumes in its folder."""
    line = next(line for line in script.read_text().splitlines() if "RUN_DIR=${RUN_DIR:-" in line)
    env = {"PATH": os.environ["PATH"], "USER": "ada", "SLURM_JOB_NAME": "dit", "SLURM_JOB_ID": "4242"}
    result = subprocess.run(["bash", "-c", f"{line}\necho $RUN_DIR"], env=env, capture_output=True, text=True)
    assert result.stdout.strip() == "/scratch/ada/runs/dit-4242"
