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
Where the ranks meet at a loopback address, the store listens there only (torch's listens on every
interface, for anyone to join; ``fairseq-train`` serves it for the ranks it spawns, as torchrun's
agent does), gloo's connections use Linux's ``lo``, and the ranks wait ``RENDEZVOUS_SECONDS`` (60)
for each other, not 30 minutes, then fail in one line. A spawned rank ends with its parent (Linux's
``PR_SET_PDEATHSIG``), so a killed ``fairseq-train`` leaves no rank training on. A port in use,
torchrun's variables that are no numbers or name a rank outside the world, and
``--distributed-world-size`` below 1 (also on a GPU: fairseq spawns no process and exits 0) are
refused in one line. Training on a GPU otherwise takes fairseq's own path unchanged.
Resuming a multi-process training, rank 0 reads the checkpoint and broadcasts it pickled, its tensors replaced by
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

``resume_with_the_batches_of_an_unbroken_run``: fairseq's ``FairseqTask.get_batch_iterator``
(``fairseq/tasks/fairseq_task.py``, ve-fairseq 0.12.3) orders the examples under the numpy seed
``--seed`` + the epoch the iterator is created at, batches them once and keeps those batches for
every later epoch (``can_reuse_epoch_itr``; only their order changes from epoch to epoch). A run
trained in one go creates it at epoch 1; a run resumed from a checkpoint of epoch E
(``checkpoint_utils.load_checkpoint``) at epoch E. ``LanguagePairDataset.ordered_indices`` sorts a
random permutation by length with a stable sort, so sentences of equal source and target length
(most sentences of a corpus) come in another order and, where such a group spans two batches, land
in another batch: the batches keep their sizes but not their sentences. The resumed run then trains
other batches than the run it continues, in its first epoch some sentences twice and others not at
all. When the iterator is kept across epochs, the wrapper builds its batches as at epoch 1 and then
starts it at the epoch asked for; iterators built anew each epoch stay fairseq's.
"""

import contextlib
import ctypes
import dataclasses
import datetime
import functools
import importlib.util
import inspect
import ipaddress
import logging
import os
import re
import signal
import socket
import sys
import time
import urllib.parse
import warnings

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



_FIRST_EPOCH_MARK = "_resumes_with_the_batches_of_an_unbroken_run"


def with_batches_of_the_first_epoch(get_batch_iterator):
    """``FairseqTask.get_batch_iterator`` whose batches kept across epochs are epoch 1's, whatever epoch it starts at."""
    signature = inspect.signature(get_batch_iterator)

    @functools.wraps(get_batch_iterator)
    def wrapper(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        task, given = call.arguments["self"], call.arguments
        kept = (not given["disable_iterator_cache"] and not given["update_epoch_batch_itr"]
                and task.can_reuse_epoch_itr(given["dataset"]) and not getattr(task.cfg, "rebuild_batches", False))
        epoch = given["epoch"]
        if epoch <= 1 or not kept or given["dataset"] in task.dataset_to_epoch_iter:
            return get_batch_iterator(*args, **kwargs)
        given["epoch"] = 1
        iterator = get_batch_iterator(*call.args, **call.kwargs)
        iterator.epoch = epoch
        given["dataset"].set_epoch(epoch)
        return iterator

    setattr(wrapper, _FIRST_EPOCH_MARK, True)
    return wrapper


def resume_with_the_batches_of_an_unbroken_run():
    """Install :func:`with_batches_of_the_first_epoch` on ``FairseqTask`` (once)."""
    from fairseq.tasks import FairseqTask

    if not getattr(FairseqTask.get_batch_iterator, _FIRST_EPOCH_MARK, False):
        FairseqTask.get_batch_iterator = with_batches_of_the_first_epoch(FairseqTask.get_batch_iterator)


# --------------------------------------------------------------------------- training in CPU processes

_CPU_MARK = "_trains_in_cpu_processes"
TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")  # what fairseq looks for
RENDEZVOUS_SECONDS = 60  # how long the ranks of a training on the CPU wait for each other to start
_GROUP_EXISTS = "Distributed is already initialized, cannot initialize twice!"  # fairseq's warning
PR_SET_PDEATHSIG = 1  # linux/prctl.h

logger = logging.getLogger(__name__)


def trains_on_cpu(cfg) -> bool:
    """fairseq's Trainer uses the CPU with --cpu, and without a CUDA device whatever the flags."""
    return not cfg.common.tpu and (cfg.common.cpu or not torch.cuda.is_available())


def free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_world_size(world_size):
    """fairseq spawns ``min(GPUs, --distributed-world-size)`` processes: 0 or fewer train nothing
    and exit 0, on a GPU as on the CPU."""
    if world_size < 1:
        raise ConfigurationError(f"--distributed-world-size {world_size}: the number of processes to train in "
                                 "must be 1 or more")


# torchrun's environment: the four variables fairseq reads, checked before anything waits on them

_LEFT_OVER = ("set by torchrun; a shell they were left in trains in one process after "
              "`unset MASTER_ADDR MASTER_PORT WORLD_SIZE RANK`")


@dataclasses.dataclass(frozen=True)
class EnvironmentWorld:
    host: str
    port: int
    world_size: int
    rank: int

    def __str__(self):
        return " ".join(f"{name}={os.environ[name]}" for name in TORCHRUN_VARIABLES)


def environment_number(name, lowest, highest=None):
    value = os.environ[name]
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < lowest or (highest is not None and number > highest):
        allowed = f"from {lowest} to {highest}" if highest is not None else f"of {lowest} or more"
        raise ConfigurationError(f"{name}={value!r} in the environment: a whole number {allowed} is allowed "
                                 f"({_LEFT_OVER})")
    return number


def environment_world():
    """The world torchrun's variables describe, when all four are set (else None): whole numbers,
    the port a real one, the rank one of the world's; anything else is refused in one line."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    world_size = environment_number("WORLD_SIZE", 1)
    rank = environment_number("RANK", 0)
    port = environment_number("MASTER_PORT", 1, 65535)
    if rank >= world_size:
        raise ConfigurationError(f"RANK={rank} in the environment with WORLD_SIZE={world_size}: a rank from 0 to "
                                 f"{world_size - 1} is allowed ({_LEFT_OVER})")
    host = os.environ["MASTER_ADDR"].strip()
    if not host:
        raise ConfigurationError(f"MASTER_ADDR={os.environ['MASTER_ADDR']!r} in the environment: the address of "
                                 f"rank 0 is needed ({_LEFT_OVER})")
    return EnvironmentWorld(host, port, world_size, rank)


def join_torchrun_world(distributed, world):
    """What fairseq does for torchrun on GPUs, minus the device id (a rank modulo the GPU count)."""
    distributed.distributed_init_method = "env://"
    distributed.distributed_world_size = world.world_size
    distributed.distributed_rank = world.rank
    distributed.distributed_no_spawn = True


# the rendezvous: where the ranks meet, on the loopback interface only when they are all on this machine


def is_loopback(host) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_tcp_address(init_method):
    """(host, port) of a ``tcp://`` init method on a loopback address, else None."""
    url = urllib.parse.urlparse(init_method)
    if url.scheme != "tcp" or not is_loopback(url.hostname or ""):
        return None
    try:
        port = url.port
    except ValueError:  # not a number, or out of range
        port = None
    if not port:
        raise ConfigurationError(f"--distributed-init-method {init_method}: a tcp:// address needs a port from 1 to "
                                 "65535 (tcp://127.0.0.1:PORT)")
    return ("127.0.0.1" if url.hostname == "localhost" else url.hostname), port


def listen_on_loopback(host, port, what):
    """A socket listening on ``host`` (a loopback address) only; ``port`` 0 takes a free one. A port
    that is taken is refused in one line starting with ``what`` (the flag and value that chose it)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does
    try:
        listener.bind((host, port))
        listener.listen(128)
    except OSError as error:
        listener.close()
        raise ConfigurationError(f"{what}: cannot listen on {host}:{port} ({error.strerror}); give a port no other "
                                 "program uses") from None
    return listener


def loopback_store(listener, world_size, timeout, wait_for_workers):
    """torch's TCPStore serving on ``listener``: torch's own store listens on every interface."""
    host, port = listener.getsockname()[:2]
    return torch.distributed.TCPStore(host, port, world_size, True, timeout, wait_for_workers=wait_for_workers,
                                      master_listen_fd=listener.detach())


def use_loopback_for_gloo():
    """gloo's connections between the ranks listen on the address the machine's host name resolves
    to (often a network address) unless ``GLOO_SOCKET_IFNAME`` names an interface: Linux's loopback
    ``lo`` when every rank is on this machine, unless the variable is set already."""
    if "GLOO_SOCKET_IFNAME" not in os.environ and "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"


def wait_for_listener(host, port, deadline):
    """Until ``deadline`` (``time.monotonic``), wait for something to listen at host:port (quietly:
    torch's store client logs each failed try with a C++ backtrace)."""
    while True:
        try:
            socket.create_connection((host, port), timeout=5).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens at {host}:{port}") from None
            time.sleep(0.5)


def meet(backend, host, port, rank, world_size, hosts_store, origin, advice=""):
    """The process group of ``rank``, made before fairseq's ``distributed_init`` (which keeps a group
    it finds): rank 0 serves the store where ``hosts_store`` (else the launcher or torchrun's agent
    does), on the loopback interface only for a loopback ``host``. The ranks wait
    :data:`RENDEZVOUS_SECONDS` for each other, not torch's 30 minutes, then fail in one line
    starting with ``origin`` (what chose the address) and ending with ``advice``; collectives keep
    torch's timeout."""
    if torch.distributed.is_initialized():
        return  # fairseq keeps using its first group in an interpreter that trains again
    loopback = is_loopback(host)
    if loopback:
        use_loopback_for_gloo()
    timeout = datetime.timedelta(seconds=RENDEZVOUS_SECONDS)
    logger.info(f"rank {rank} of {world_size} waits up to {RENDEZVOUS_SECONDS} s for the other ranks at {host}:{port}")
    try:
        if hosts_store and loopback:
            store = loopback_store(listen_on_loopback(host, port, origin), world_size, timeout, wait_for_workers=True)
        elif hosts_store:  # the other ranks are on other machines: every interface
            store = torch.distributed.TCPStore(host, port, world_size, True, timeout)
        else:
            wait_for_listener(host, port, time.monotonic() + RENDEZVOUS_SECONDS)
            store = torch.distributed.TCPStore(host, port, world_size, False, timeout)
        # the prefix torch gives its own rendezvous's store, which torchrun's agent shares
        torch.distributed.init_process_group(backend, store=torch.distributed.PrefixStore("default_pg", store),
                                             rank=rank, world_size=world_size)
    except (torch.distributed.DistError, TimeoutError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigurationError(f"{origin}: the {world_size} ranks did not all meet at {host}:{port} within "
                                 f"{RENDEZVOUS_SECONDS} s (rank {rank}: {reason}){advice}") from None
    store.set_timeout(torch.distributed.default_pg_timeout)  # torch's, for the groups fairseq makes later
    logger.info(f"initialized host {socket.gethostname()} as rank {rank}")


@contextlib.contextmanager
def group_made_by_the_plugin():
    """fairseq's ``distributed_init`` warns when it finds a process group: :func:`meet` made it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape(_GROUP_EXISTS))
        yield


# spawned ranks

def die_with_parent(parent):
    """A spawned rank ends with the process that spawned it, however that one ends (SIGKILL too):
    no rank trains on alone, writing checkpoints (Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``; a
    parent that ended before the call ends the rank at once). Elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def spawn_cpu_processes(cfg, main, kwargs):
    """One process per rank on this machine, each running fairseq's own ``distributed_main``. With a
    loopback address (``--distributed-port``, a free port without it, or a ``tcp://`` init method on
    a loopback address) this process serves the store on that address only, as torchrun's agent
    does, so a port in use is refused at once."""
    distributed = cfg.distributed_training
    world_size, init_method = distributed.distributed_world_size, distributed.distributed_init_method
    if distributed.distributed_rank not in (0, None):
        raise ConfigurationError(f"--distributed-rank {distributed.distributed_rank}: fairseq-train --cpu "
                                 f"--distributed-world-size {world_size} starts ranks 0 to {world_size - 1} itself; "
                                 "give a rank only with --distributed-no-spawn")
    listener = None
    if init_method is None:
        port = distributed.distributed_port
        if port > 65535:
            raise ConfigurationError(f"--distributed-port {port}: a port from 1 to 65535 is allowed "
                                     "(none: a free one)")
        listener = listen_on_loopback("127.0.0.1", max(port, 0), f"--distributed-port {port}")
    elif loopback_tcp_address(init_method):
        host, port = loopback_tcp_address(init_method)
        listener = listen_on_loopback(host, port, f"--distributed-init-method {init_method}")
    store = None
    if listener is not None:
        host, port = listener.getsockname()[:2]
        distributed.distributed_init_method = f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
        store = loopback_store(listener, None, torch.distributed.default_pg_timeout, wait_for_workers=False)
    kwargs["start_rank"] = 0
    distributed.distributed_rank = None  # each process takes its index
    torch.multiprocessing.spawn(run_rank, args=(main, cfg, kwargs, os.getpid(), store is not None),
                                nprocs=world_size, join=True)
    del store  # kept serving until every rank has ended


def run_rank(index, main, cfg, kwargs, parent, meets_at_parent):
    """fairseq's ``distributed_main`` in a spawned process, then :func:`leave_process_group`."""
    die_with_parent(parent)
    distributed = cfg.distributed_training
    if meets_at_parent:
        host, port = loopback_tcp_address(distributed.distributed_init_method)
        meet(distributed.distributed_backend, host, port, index, distributed.distributed_world_size,
             hosts_store=False, origin=f"--distributed-world-size {distributed.distributed_world_size}")
    with group_made_by_the_plugin():
        distributed_utils.distributed_main(index, main, cfg, kwargs)
    leave_process_group()


def leave_process_group():
    """torch's orderly end of a process group, after fairseq's last barrier, in a process started
    for one training (spawned, or by torchrun): a gloo rank that exits with the group open can
    abort (SIGABRT) as the other rank closes its connections. (fairseq keeps using the group it
    made from it, ``get_global_group``, so an interpreter that trains again keeps the group.)"""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def with_cpu_processes(call_main):
    """``call_main`` that starts the processes of a multi-process training on the CPU."""

    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        distributed = cfg.distributed_training
        check_world_size(distributed.distributed_world_size)
        if not trains_on_cpu(cfg):
            return call_main(cfg, main, **kwargs)
        if distributed.distributed_backend == "nccl":  # fairseq's default; NCCL moves CUDA tensors only
            distributed.distributed_backend = "gloo"
        world = environment_world() if distributed.distributed_init_method is None else None  # fairseq's rule
        if world is not None and world.world_size > 1:
            join_torchrun_world(distributed, world)
            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent serves it
            meet(distributed.distributed_backend, world.host, world.port, world.rank, world.world_size,
                 hosts_store=world.rank == 0 and not agent_store, origin=f"the environment's {world}",
                 advice=f"; the variables are {_LEFT_OVER}")
            with group_made_by_the_plugin():
                call_main(cfg, main, **kwargs)
            return leave_process_group()
        if distributed.distributed_world_size > 1 and not distributed.distributed_no_spawn:
            return spawn_cpu_processes(cfg, main, kwargs)
        address = distributed.distributed_init_method and loopback_tcp_address(distributed.distributed_init_method)
        if distributed.distributed_world_size > 1 and address:  # one rank of a world started by hand
            rank, world_size = distributed.distributed_rank, distributed.distributed_world_size
            if not 0 <= rank < world_size:
                raise ConfigurationError(f"--distributed-rank {rank}: a rank from 0 to {world_size - 1} is allowed "
                                         f"with --distributed-world-size {world_size}")
            meet(distributed.distributed_backend, *address, rank, world_size, hosts_store=rank == 0,
                 origin=f"--distributed-init-method {distributed.distributed_init_method}")
            with group_made_by_the_plugin():
                return call_main(cfg, main, **kwargs)
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

