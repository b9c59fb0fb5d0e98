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

import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conformance_utils import (FAMILIES, IN_PROCESS, CliRun, build_like_fairseq_train, data_bin_fixture, flags_of,
                               run_in_one_interpreter)
from fusion_fairseq.cli import user_dir
from fusion_fairseq.fairseq_fixes import free_local_port

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


def fairseq_train_script():
    """The ``fairseq-train`` console script itself (torchrun runs a Python file, not a shim)."""
    return os.path.join(sysconfig.get_path("scripts"), "fairseq-train")


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
