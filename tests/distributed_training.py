"""Data-parallel training on CPU for ``tests/test_distributed.py``: the plugin's fairseq models and
fairseq's criterion in ``torch.nn.parallel.DistributedDataParallel`` over a gloo process group.

fairseq's own multi-process path needs CUDA devices (``infer_init_method`` divides by the GPU
count; ``DistributedFairseqModel`` passes ``device_ids``, which DDP refuses for a CPU module), so
the workers do what fairseq's Trainer does for one update: criterion on the rank's batch, sample
sizes summed over ranks, loss scaled by world size / total sample size (DDP averages the
gradients), one optimizer step. Kept in its own module so that the spawned processes import
nothing from the test module.
"""

import os
from dataclasses import dataclass
from typing import List, Sequence

import torch
import torch.distributed as dist
from fairseq.distributed import ModuleProxyWrapper
from fairseq.modules import FairseqDropout
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from conformance_utils import build_like_fairseq_train

STEPS, SENTENCES_PER_RANK, LEARNING_RATE, SEED = 3, 4, 0.5, 1


@dataclass(frozen=True)
class Job:
    """One configuration to train: its data, arch and flags, and where the result goes."""

    name: str
    data_bin: str
    arch: str
    flags: Sequence[str]
    out_dir: str


def without_dropout(model: nn.Module) -> nn.Module:
    """Every dropout probability set to 0 (modules and the float rates that functional dropout
    reads), so that training on split batches and on the joined batch sees the same network."""
    for module in model.modules():
        if isinstance(module, (nn.Dropout, FairseqDropout)):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
    return model


def build(job: Job):
    built = build_like_fairseq_train(job.data_bin, job.arch, job.flags, seed=SEED)
    model = without_dropout(built.model).train()
    criterion = built.task.build_criterion(built.args)
    built.task.load_dataset("train")
    return built.task.dataset("train"), model, criterion


def batch_indices(step: int, rank: int) -> List[int]:
    """The sentences rank ``rank`` trains on at ``step``: consecutive, disjoint over ranks."""
    start = (step * 2 + rank) * SENTENCES_PER_RANK
    return list(range(start, start + SENTENCES_PER_RANK))


def train_step(model, criterion, dataset, indices: List[int], world_size: int, distributed: bool):
    sample = dataset.collater([dataset[i] for i in indices])
    loss, sample_size, _ = criterion(model, sample)
    total = torch.tensor(float(sample_size))
    if distributed:
        dist.all_reduce(total)
    (loss * world_size / total).backward()


def train_single_process(job: Job, world_size: int = 2) -> dict:
    """The reference: one process, every step on the ranks' batches joined into one batch."""
    dataset, model, criterion = build(job)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step in range(STEPS):
        optimizer.zero_grad()
        joined = [i for rank in range(world_size) for i in batch_indices(step, rank)]
        train_step(model, criterion, dataset, joined, 1, distributed=False)
        optimizer.step()
    return model.state_dict()


def worker(rank: int, world_size: int, init_file: str, jobs: List[Job]):
    """One rank: every job's STEPS updates under DDP; its final parameters saved per rank."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        for job in jobs:
            dataset, model, criterion = build(job)
            # the proxy lets the criterion reach get_normalized_probs, as in fairseq's own wrapper
            ddp = ModuleProxyWrapper(DistributedDataParallel(model, find_unused_parameters=False))
            optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
            for step in range(STEPS):
                optimizer.zero_grad()
                train_step(ddp, criterion, dataset, batch_indices(step, rank), world_size, distributed=True)
                optimizer.step()
            torch.save(model.state_dict(), os.path.join(job.out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
