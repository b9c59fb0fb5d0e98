"""Data-parallel training: one configuration per model family (``conformance_utils.FAMILIES``)
trains for a few updates in 2 processes on CPU (gloo, ``DistributedDataParallel`` with
``find_unused_parameters=False``, fairseq's criterion; see ``distributed_training``). Afterwards
both ranks hold identical parameters, equal within float tolerance to one process trained on the
two ranks' batches joined."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from conformance_utils import FAMILIES, data_bin_fixture, flags_of
from distributed_training import Job, build, train_single_process, worker

WORLD_SIZE = 2


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    """``{family id: (job, [state dict per rank])}``, all families in one pair of processes."""
    jobs = []
    for family in FAMILIES:
        out_dir = str(tmp_path_factory.mktemp(f"ddp-{family.id}"))
        data_bin = request.getfixturevalue(data_bin_fixture(family))
        jobs.append(Job(family.id, data_bin, family.arch, tuple(flags_of(family)), out_dir))
    init_file = str(tmp_path_factory.mktemp("ddp-init") / "rendezvous")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        mp.spawn(worker, args=(WORLD_SIZE, init_file, jobs), nprocs=WORLD_SIZE, join=True)
    return {job.name: (job, [torch.load(os.path.join(job.out_dir, f"rank{rank}.pt")) for rank in range(WORLD_SIZE)])
            for job in jobs}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda v: v.id)
def test_data_parallel_training_matches_one_process(family, trained):
    job, (rank0, rank1) = trained[family.id]
    torch.set_num_threads(1)
    reference = train_single_process(job, WORLD_SIZE)
    assert rank0.keys() == rank1.keys() == reference.keys()
    unequal = [name for name in rank0 if not torch.equal(rank0[name], rank1[name])]
    assert not unequal, f"parameters differ between the ranks: {unequal}"
    for name in reference:
        assert torch.allclose(rank0[name], reference[name], rtol=1e-4, atol=1e-5), (
            name, (rank0[name] - reference[name]).abs().max().item())
    initial = build(job)[1].state_dict()
    change = max((reference[name] - initial[name]).abs().max().item() for name in reference)
    assert change > 1e-2, f"training moved no parameter by more than {change:.2g}: the comparison would be void"
