"""Narrow fixes of upstream fairseq behaviour, applied when the plugin is imported (``global_changes``).

``keep_last_partial_batch``: fairseq's ``data_utils.batch_by_size`` (main branch, ve-fairseq
0.12.3) builds its batches with the compiled ``data_utils_fast`` helpers, which cover every
index, and then removes the last batch when its size is not a multiple of
``--required-batch-size-multiple`` (default 8; fairseq issue #5036). fairseq-generate then
translates, fairseq-validate scores and every training epoch sees only part of the data: 24 of 30
sentences of a 30-sentence test set. The multiple is a speed hint for the other batches, never a
reason to lose sentences, so the wrapper gives the removed indices back as a last, smaller batch.
Everything else (batch order, sizes, fixed shapes) stays fairseq's.

``train_in_cpu_processes``: fairseq's multi-process training (``fairseq/distributed/utils.py``,
``call_main`` and ``infer_init_method``; ``fairseq/models/distributed_fairseq_model.py``, main
branch, ve-fairseq 0.12.3) counts processes in CUDA devices. On a machine without a GPU,
``fairseq-train --cpu --distributed-world-size 2`` stops at ``world size is 2 but have 0 available
devices``, with ``--distributed-init-method`` it spawns ``min(GPUs, world size)`` = 0 processes and
exits 0 having trained nothing, and under ``torchrun`` every process trains alone (the default
world size is the GPU count, 1, so fairseq never reads torchrun's ``WORLD_SIZE``). Once the
processes exist, ``--ddp-backend c10d`` (the default) gives ``DistributedDataParallel`` the device
id ``[0]``, which torch refuses for a CPU module. When training on the CPU, the wrapper of
``call_main`` takes gloo for fairseq's default backend, NCCL (which moves CUDA tensors only),
joins torchrun's world (``env://``, its ``WORLD_SIZE`` and ``RANK``) or spawns
``--distributed-world-size`` processes on this machine, meeting at ``--distributed-init-method``
or ``tcp://127.0.0.1:<--distributed-port, else a free port>``; fairseq's DDP is told no device id
for a CPU module; a spawned or torchrun rank leaves the process group when its training ends.
Training on a GPU takes fairseq's own path unchanged. Resuming a multi-process
training, rank 0 reads the checkpoint and broadcasts it pickled, its tensors replaced by
``_TensorPlaceholder`` (a frozen dataclass holding an index); the other ranks unpickle it with
``torch.load``, whose ``weights_only`` default (torch >= 2.6) refuses that class, on GPUs too: it
joins torch's safe globals.

``train_bf16_without_tpu``: fairseq's ``options.parse_args_and_arch`` (main branch, ve-fairseq
0.12.3) sets ``--tpu`` for every ``--bf16`` run (fairseq issue #4696), and its Trainer then asks
torch_xla for a TPU device: ``fairseq-train --bf16`` stops at ``'NoneType' object has no attribute
'xla_device'`` on a GPU and on the CPU. Where torch_xla is not installed no TPU can be meant, so the
wrapper of ``call_main`` clears that flag, and fairseq's own bfloat16 path trains on the GPU (or
the CPU with ``--cpu``): the model and criterion in bfloat16, float32 master weights in
``FP16Optimizer``, no loss scaling. With torch_xla installed, ``--bf16`` stays fairseq's TPU path.
"""

import functools
import importlib.util
import inspect
import os
import socket

import numpy as np
import torch
from fairseq.data import data_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.models import distributed_fairseq_model

from .errors import ConfigurationError

_MARK = "_keeps_last_partial_batch"


def with_last_partial_batch(batch_by_size):
    """``batch_by_size`` that returns the trailing indices it left out as one more batch."""

    @functools.wraps(batch_by_size)
    def wrapper(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):  # an iterator could be read only once
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is not None:  # batches of the given shapes only, by design
            return batches
        covered = sum(len(batch) for batch in batches)
        # the batches are consecutive runs of ``indices``: what is left out is their tail
        if covered < len(indices):
            batches = list(batches) + [indices[covered:]]
        return batches

    setattr(wrapper, _MARK, True)
    return wrapper


def keep_last_partial_batch():
    """Install :func:`with_last_partial_batch` on ``fairseq.data.data_utils`` (once: the plugin
    may be imported under two names, as a package and through ``--user-dir``)."""
    if not getattr(data_utils.batch_by_size, _MARK, False):
        data_utils.batch_by_size = with_last_partial_batch(data_utils.batch_by_size)



# --------------------------------------------------------------------------- training in CPU processes

_CPU_MARK = "_trains_in_cpu_processes"
TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")  # what fairseq looks for


def trains_on_cpu(cfg) -> bool:
    """fairseq's Trainer uses the CPU with --cpu, and without a CUDA device whatever the flags."""
    return not cfg.common.tpu and (cfg.common.cpu or not torch.cuda.is_available())


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES) and int(os.environ["WORLD_SIZE"]) > 1


def free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def join_torchrun_world(distributed):
    """What fairseq does for torchrun on GPUs, minus the device id (a rank modulo the GPU count)."""
    distributed.distributed_init_method = "env://"
    distributed.distributed_world_size = int(os.environ["WORLD_SIZE"])
    distributed.distributed_rank = int(os.environ["RANK"])
    distributed.distributed_no_spawn = True


def spawn_cpu_processes(cfg, main, kwargs):
    """One process per rank on this machine, each running fairseq's own ``distributed_main``."""
    distributed = cfg.distributed_training
    if distributed.distributed_init_method is None:
        port = distributed.distributed_port if distributed.distributed_port > 0 else free_local_port()
        distributed.distributed_init_method = f"tcp://127.0.0.1:{port}"
    kwargs["start_rank"] = distributed.distributed_rank
    distributed.distributed_rank = None  # each process takes start_rank + its index
    torch.multiprocessing.spawn(run_rank, args=(main, cfg, kwargs), nprocs=distributed.distributed_world_size,
                                join=True)


def run_rank(index, main, cfg, kwargs):
    """fairseq's ``distributed_main`` in a spawned process, then :func:`leave_process_group`."""
    distributed_utils.distributed_main(index, main, cfg, kwargs)
    leave_process_group()


def leave_process_group():
    """torch's orderly end of a process group, after fairseq's last barrier, in a process started
    for one training (spawned, or by torchrun): a gloo rank that exits with the group open can
    abort (SIGABRT) as the other rank closes its connections. (fairseq keeps using the group it
    made from it, ``get_global_group``, so an interpreter that trains again keeps the group.)"""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def check_world_size(world_size):
    """fairseq spawns ``min(GPUs, --distributed-world-size)`` processes: 0 or fewer train nothing
    and exit 0, on a GPU as on the CPU."""
    if world_size < 1:
        raise ConfigurationError(f"--distributed-world-size {world_size}: the number of processes to train in "
                                 "must be 1 or more")


def with_cpu_processes(call_main):
    """``call_main`` that starts the processes of a multi-process training on the CPU."""

    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        distributed = cfg.distributed_training
        check_world_size(distributed.distributed_world_size)
        if trains_on_cpu(cfg):
            if distributed.distributed_backend == "nccl":  # fairseq's default; NCCL moves CUDA tensors only
                distributed.distributed_backend = "gloo"
            if launched_by_torchrun() and distributed.distributed_init_method is None:
                join_torchrun_world(distributed)
                call_main(cfg, main, **kwargs)
                return leave_process_group()
            if distributed.distributed_world_size > 1 and not distributed.distributed_no_spawn:
                return spawn_cpu_processes(cfg, main, kwargs)
        return call_main(cfg, main, **kwargs)

    setattr(wrapper, _CPU_MARK, True)
    return wrapper


_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters


class DistributedDataParallelOnCpu(torch.nn.parallel.DistributedDataParallel):
    """torch's ``DistributedDataParallel``, given no device ids for a module on the CPU: torch
    refuses them there, and fairseq passes ``[--device-id]`` whatever the device. fairseq's
    ``--broadcast-buffers`` (whether the buffers go from rank 0 to the others before each forward)
    reaches it as ``broadcast_buffers``, which torch >= 2.13 deprecates with a ``FutureWarning`` in
    every run: it is passed as ``forward_sync_buffers``, its replacement. The one difference:
    without ``--broadcast-buffers`` (fairseq's default) torch now also broadcasts the buffers once
    when DDP is built, where every rank holds those of the same model built from the same seed."""

    _trains_in_cpu_processes = True

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(parameter.device.type == "cpu" for parameter in module.parameters()):
            device_ids = output_device = None
        if _FORWARD_SYNC and "broadcast_buffers" in kwargs and "forward_sync_buffers" not in kwargs:
            kwargs["forward_sync_buffers"] = kwargs.pop("broadcast_buffers")
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


# --------------------------------------------------------------------------- bfloat16 without a TPU

_BF16_MARK = "_trains_bf16_without_tpu"


def tpu_implied_by_bf16(cfg) -> bool:
    """fairseq set ``--tpu`` because of ``--bf16``, and there is no torch_xla to drive a TPU."""
    return cfg.common.bf16 and cfg.common.tpu and importlib.util.find_spec("torch_xla") is None


def with_bf16_without_tpu(call_main):
    """``call_main`` that trains ``--bf16`` on the GPU or CPU where fairseq assumed a TPU."""

    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        if tpu_implied_by_bf16(cfg):
            cfg.common.tpu = False
        return call_main(cfg, main, **kwargs)

    setattr(wrapper, _BF16_MARK, True)
    return wrapper


def train_bf16_without_tpu():
    """Install :func:`with_bf16_without_tpu` on ``fairseq.distributed.utils`` (once)."""
    if not getattr(distributed_utils.call_main, _BF16_MARK, False):
        distributed_utils.call_main = with_bf16_without_tpu(distributed_utils.call_main)


def train_in_cpu_processes():
    """Install :func:`with_cpu_processes` on ``fairseq.distributed.utils`` and
    :class:`DistributedDataParallelOnCpu` where fairseq's ``DistributedFairseqModel`` finds DDP
    (once each, whatever name the plugin was imported under); let other ranks read the
    checkpoint rank 0 broadcasts."""
    if not getattr(distributed_utils.call_main, _CPU_MARK, False):
        distributed_utils.call_main = with_cpu_processes(distributed_utils.call_main)
    if not getattr(distributed_fairseq_model.DistributedDataParallel, _CPU_MARK, False):
        distributed_fairseq_model.DistributedDataParallel = DistributedDataParallelOnCpu
    torch.serialization.add_safe_globals([distributed_utils._TensorPlaceholder])  # idempotent

