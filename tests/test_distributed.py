"""Multi-process training through fairseq's own trainer on CPU (gloo; ``fusion_fairseq.fairseq_fixes``
starts the processes and gives fairseq's DDP a CPU module).

For every model family (``conformance_utils.FAMILIES``) and both ``--ddp-backend c10d`` and
``legacy_ddp``, 2 processes x 1 batch of 4 sentences per update end with the parameters of 1
process with ``--update-freq 2`` on the same batches (dropout off, SGD, within 1e-5), and the
checkpoint rank 0 writes resumes in one process. The matrix runs through ``--distributed-no-spawn``
with the ranks given, each rank one interpreter training every configuration in turn (an
interpreter per configuration and rank would cost ~10 s each). The two ways a user
starts the processes, ``fairseq-train --cpu --distributed-world-size 2`` and ``torchrun``, train
one family each.
"""

import importlib.metadata
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conformance_utils import (FAMILIES, IN_PROCESS, CliRun, build_like_fairseq_train, data_bin_fixture, flags_of,
                               run_in_one_interpreter)
from fusion_fairseq.cli import user_dir
from test_fairseq_fixes import free_local_port, listening_sockets, running

pytestmark = pytest.mark.slow  # fairseq command-line runs and trained checkpoints: CI runs them

UPDATES = 3
BACKENDS = ("c10d", "legacy_ddp")
TRAINING = (
    "--optimizer", "sgd", "--lr", "0.5", "--batch-size", "4", "--required-batch-size-multiple", "1",
    "--max-update", str(UPDATES), "--dropout", "0", "--seed", "1", "--cpu", "--disable-validation",
    "--no-epoch-checkpoints", "--no-progress-bar", "--log-interval", "1", *IN_PROCESS,
)
FAMILY = {family.id: family for family in FAMILIES}
SPAWNED, TORCHRUN = "fusion_transformer", "layerwise_coordination"  # the families of the two launchers


def train_args(family, data_bin, save_dir, *extra):
    return [data_bin, "--user-dir", user_dir(), "--arch", family.arch, *flags_of(family), *TRAINING,
            "--save-dir", save_dir, *extra]


def train_run(name, family, data_bin, save_dir, *extra):
    return CliRun(name, "fairseq_cli.train", train_args(family, data_bin, save_dir, *extra))


def rank_runs(rank, port, configurations):
    """Rank ``rank``'s trainings of ``configurations`` ([(name, family, data bin, save dir, backend)])."""
    ranked = ("--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-no-spawn",
              "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-backend", "gloo")
    return [train_run(name, family, data_bin, save_dir, *ranked, "--ddp-backend", backend)
            for name, family, data_bin, save_dir, backend in configurations]


def run_ranks(configurations, work_dir):
    """Both ranks at once, each in one interpreter (one process group, which fairseq keeps using
    after the first training); rank 0's runs (rank 1 logs warnings only)."""
    port = free_local_port()
    plans = [rank_runs(rank, port, configurations) for rank in range(2)]
    dirs = [os.path.join(work_dir, f"rank{rank}") for rank in range(2)]
    for directory in dirs:
        os.makedirs(directory)
    with ThreadPoolExecutor(2) as pool:
        rank0, rank1 = pool.map(lambda rank: run_in_one_interpreter(plans[rank], dirs[rank], timeout=400), range(2))
    for run, other in zip(rank0, rank1):
        run.error = run.error or other.error
    return rank0


def parameters(save_dir):
    return torch.load(os.path.join(save_dir, "checkpoint_last.pt"))["model"]


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    """Every family's two-process training per backend, its one-process reference, and the
    one-process resumption of its c10d checkpoint: ``{(family, kind): (save dir, CliRun)}``."""
    root = str(tmp_path_factory.mktemp("distributed"))
    data_bins = {family.id: request.getfixturevalue(data_bin_fixture(family)) for family in FAMILIES}
    configurations = [(f"{family.id}-{backend}", family, data_bins[family.id], os.path.join(root, f"{family.id}-{backend}"),
                       backend) for family in FAMILIES for backend in BACKENDS]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # two ranks on two cores
        ranked = run_ranks(configurations, os.path.join(root, "ranks"))
        results = {(family.id, backend): (save_dir, run)
                   for (_, family, _, save_dir, backend), run in zip(configurations, ranked)}
        single = []
        for family in FAMILIES:
            reference = os.path.join(root, f"{family.id}-reference")
            resumed = os.path.join(root, f"{family.id}-resumed")
            shutil.copytree(results[family.id, "c10d"][0], resumed)
            single += [(family.id, "reference", reference,
                        train_run("reference", family, data_bins[family.id], reference, "--update-freq", "2")),
                       (family.id, "resumed", resumed,
                        train_run("resumed", family, data_bins[family.id], resumed, "--max-update", str(UPDATES + 1)))]
        os.makedirs(os.path.join(root, "single"))
        run_in_one_interpreter([run for *_, run in single], os.path.join(root, "single"))
    results.update({(family_id, kind): (save_dir, run) for family_id, kind, save_dir, run in single})
    return results


def finished(trained, family_id, kind):
    save_dir, run = trained[family_id, kind]
    assert run.error is None, f"{family_id} {kind}: {run.error}\n{run.log[-3000:]}"
    return save_dir, run


def assert_same_parameters(actual, reference, tolerance=1e-5):
    assert actual.keys() == reference.keys()
    for name in reference:
        difference = (actual[name] - reference[name]).abs().max().item()
        assert difference <= tolerance, (name, difference)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES, ids=lambda v: v.id)
def test_two_processes_match_one_with_update_freq_2(family, backend, trained, request):
    save_dir, run = finished(trained, family.id, backend)
    assert f"num_updates={UPDATES}," in run.log and "bsz=8," in run.log, run.log[-2000:]
    reference = parameters(finished(trained, family.id, "reference")[0])
    assert_same_parameters(parameters(save_dir), reference)
    initial = build_like_fairseq_train(request.getfixturevalue(data_bin_fixture(family)), family.arch,
                                       flags_of(family)).model.state_dict()
    change = max((reference[name] - initial[name]).abs().max().item() for name in reference)
    assert change > 1e-2, f"training moved no parameter by more than {change:.2g}: the comparison would be void"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda v: v.id)
def test_rank_0_checkpoint_resumes_in_one_process(family, trained):
    save_dir, run = finished(trained, family.id, "resumed")
    assert f"(epoch 1 @ {UPDATES} updates)" in run.log, run.log[-2000:]
    assert f"num_updates={UPDATES + 1}," in run.log, run.log[-2000:]
    state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES + 1


def test_every_rank_names_a_structural_change_when_training_resumes(trained, request, tmp_path):
    """fairseq reads the checkpoint on rank 0 and sends its state to the others: rank 1 failed in torch's strict
    load with fairseq's multi-line error instead of the plugin's line, and a launcher shows whichever rank ends
    first."""
    family = FAMILY[SPAWNED]
    save_dir = str(tmp_path / "resumed")
    shutil.copytree(finished(trained, family.id, "c10d")[0], save_dir)
    data_bin, port = request.getfixturevalue(data_bin_fixture(family)), free_local_port()
    plans = [[train_run("resumed", family, data_bin, save_dir, "--max-update", str(UPDATES + 1), "--fuse-decoder", "avg",
                        "--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-no-spawn",
                        "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-backend", "gloo")]
             for rank in range(2)]
    dirs = [str(tmp_path / f"rank{rank}") for rank in range(2)]
    for directory in dirs:
        os.makedirs(directory)
    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(2) as pool:
        patch.setenv("OMP_NUM_THREADS", "1")
        runs = list(pool.map(lambda rank: run_in_one_interpreter(plans[rank], dirs[rank], timeout=400)[0], range(2)))
    for rank, run in enumerate(runs):
        last = (run.error or "").strip().splitlines()[-1:]
        assert last and last[0].startswith("fusion_fairseq.errors.ConfigurationError: fairseq-train resumes from "), \
            f"rank {rank}: {run.error}"
        assert "trained with fuse_decoder 'sa', but the command line gives fuse_decoder 'avg'" in last[0]


def fairseq_train_script():
    """The ``fairseq-train`` console script itself (torchrun runs a Python file, not a shim), where
    fairseq's installation wrote it: a virtualenv that sees a system-wide fairseq has none in its own
    ``bin``."""
    (entry_point,) = importlib.metadata.entry_points(group="console_scripts", name="fairseq-train")
    (script,) = [file.locate() for file in entry_point.dist.files if file.name == "fairseq-train"]
    return os.path.realpath(script)


def run_command(command, timeout=300):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-5000:]}"
    return result.stdout + result.stderr


@pytest.mark.parametrize("launcher", ["fairseq-train", "torchrun"])
def test_users_commands_train_two_processes(launcher, trained, request, tmp_path):
    """``fairseq-train --cpu --distributed-world-size 2`` (fairseq's default backends, NCCL and
    c10d) and ``torchrun --nproc_per_node 2 fairseq-train --cpu``: one world of two ranks, whose
    parameters are the one-process reference's."""
    family = FAMILY[SPAWNED if launcher == "fairseq-train" else TORCHRUN]
    args = train_args(family, request.getfixturevalue(data_bin_fixture(family)), str(tmp_path))
    if launcher == "fairseq-train":
        log = run_command([sys.executable, fairseq_train_script(), *args, "--distributed-world-size", "2"])
    else:
        log = run_command([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(free_local_port()),
                           fairseq_train_script(), *args])
    assert "initialized host" in log and "as rank 1" in log, log[-3000:]
    assert f"num_updates={UPDATES}," in log and "bsz=8," in log, log[-3000:]
    assert_same_parameters(parameters(str(tmp_path)), parameters(finished(trained, family.id, "reference")[0]))


# --------------------------------------------------------------------------- what a user's machine sees


def live_processes():
    """{pid: (parent pid, command line)} of every live (not zombie) process (Linux's /proc)."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found[int(entry)] = (int(parent), command)
    return found


def children(pid):
    """The live processes whose parent is ``pid``: {pid: command line}."""
    return {child: command for child, (parent, command) in live_processes().items() if parent == pid}


def is_loopback(address):
    address = ipaddress.ip_address(address)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)


def wait_for(condition, seconds, step=0.2):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
    return True


def test_two_ranks_listen_on_loopback_only_and_end_with_fairseq_train(request, tmp_path):
    """``fairseq-train --cpu --distributed-world-size 2`` while it trains: every socket its process
    and its two ranks listen on is on 127.0.0.1 (torch's store listened on every interface, IPv4 and
    IPv6: anyone reaching the machine could join the group), and no deprecation warning of torch's
    DDP is printed. Killed with SIGKILL, its ranks end within seconds (they trained on as orphans,
    writing checkpoint_last.pt)."""
    family = FAMILY[SPAWNED]
    save_dir = tmp_path / "checkpoints"
    log_path = tmp_path / "train.log"
    args = train_args(family, request.getfixturevalue(data_bin_fixture(family)), str(save_dir),
                      "--distributed-world-size", "2", "--max-update", "1000000")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop("PYTHONWARNINGS", None)
    with open(log_path, "w") as log:
        launcher = subprocess.Popen([sys.executable, fairseq_train_script(), *args], stdout=log,
                                    stderr=subprocess.STDOUT, env=environment)
    started = {}
    try:
        trained = wait_for(lambda: "num_updates=2," in log_path.read_text() or launcher.poll() is not None, 300)
        assert trained and launcher.poll() is None, log_path.read_text()[-3000:]
        started = children(launcher.pid)
        ranks = [pid for pid, command in started.items() if "spawn_main" in command]
        assert len(ranks) == 2, started
        listening = {pid: listening_sockets(pid) for pid in [launcher.pid, *ranks]}
        assert all(listening.values()), listening  # the store, gloo's connections
        assert all(is_loopback(address) for sockets in listening.values() for address, _ in sockets), listening
        log = log_path.read_text()
        assert "`broadcast_buffers` is deprecated" not in log, log[-3000:]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=60)
        assert wait_for(lambda: not any(running(pid) for pid in ranks), 30), \
            {pid: running(pid) for pid in ranks}
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=60)
        for pid in started:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("case", ["world size 0", "port in use", "WORLD_SIZE=abc", "RANK=2 of 2"])
def test_bad_multi_process_settings_fail_naming_the_setting(case, request, tmp_path):
    """fairseq-train with a bad multi-process setting stops at once with an error of one line naming it, and
    writes nothing (it trained nothing and exited 0, gave a traceback after a wait, or hung)."""
    family = FAMILY[SPAWNED]
    save_dir = str(tmp_path / "checkpoints")
    args = train_args(family, request.getfixturevalue(data_bin_fixture(family)), save_dir)
    environment = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        environment.pop(name, None)
    torchrun = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_local_port())}
    with socket.create_server(("127.0.0.1", 0)) as holder:
        extra, named = {
            "world size 0": (["--distributed-world-size", "0"], "--distributed-world-size 0:"),
            "port in use": (["--distributed-world-size", "2", "--distributed-port", str(holder.getsockname()[1])],
                            f"--distributed-port {holder.getsockname()[1]}:"),
            "WORLD_SIZE=abc": ([], "WORLD_SIZE='abc'"),
            "RANK=2 of 2": ([], "RANK=2"),
        }[case]
        if case == "WORLD_SIZE=abc":
            environment.update(torchrun, WORLD_SIZE="abc", RANK="0")
        elif case == "RANK=2 of 2":
            environment.update(torchrun, WORLD_SIZE="2", RANK="2")
        result = subprocess.run([sys.executable, fairseq_train_script(), *args, *extra], capture_output=True,
                                text=True, timeout=300, env=environment)
    last = result.stderr.strip().splitlines()[-1]  # Python's report of the plugin's error ends with its one line
    assert result.returncode == 1, result.stderr[-3000:]
    assert last.startswith("fusion_fairseq.errors.ConfigurationError: ") and named in last, result.stderr[-3000:]
    assert not os.path.exists(os.path.join(save_dir, "checkpoint_last.pt"))
