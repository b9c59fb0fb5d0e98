"""Narrow fixes of upstream fairseq (main branch and ve-fairseq 0.12.3), applied when the plugin's models are
registered (``global_changes``): multi-process training runs on the CPU (fairseq #2879: gloo, a loopback-only store,
ranks that end with their parent), ``--bf16`` trains without a TPU (fairseq #4696), and a resumed training gets the
batches of the run it continues. Why each, and what holds: docs/safety.md ("What loading the plugin changes",
"Training in several processes on the CPU")."""

import ctypes
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

import torch
from fairseq.distributed import utils as distributed_utils
from fairseq.models import distributed_fairseq_model

from .errors import ConfigurationError

logger = logging.getLogger(__name__)


def _wrap_once(owner, name, wrap, mark):
    """Replace ``owner.name`` by ``wrap(owner.name)`` marked ``mark``, once (the plugin may be imported twice)."""
    if not getattr(getattr(owner, name), mark, False):
        wrapper = wrap(getattr(owner, name))
        setattr(wrapper, mark, True)
        setattr(owner, name, wrapper)


def with_batches_of_the_first_epoch(get_batch_iterator):
    """``get_batch_iterator`` whose batches kept across epochs are epoch 1's, whatever epoch it starts at."""
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

    return wrapper


def resume_with_the_batches_of_an_unbroken_run():
    from fairseq.tasks import FairseqTask

    _wrap_once(FairseqTask, "get_batch_iterator", with_batches_of_the_first_epoch,
               "_resumes_with_the_batches_of_an_unbroken_run")


# --- training in CPU processes ---------------------------------------------------------------

TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")  # what fairseq looks for
RENDEZVOUS_SECONDS = 60  # how long the ranks of a training on the CPU wait for each other to start
_GROUP_EXISTS = "Distributed is already initialized, cannot initialize twice!"  # fairseq's warning
_LEFT_OVER = ("set by torchrun; a shell they were left in trains in one process after "
              "`unset MASTER_ADDR MASTER_PORT WORLD_SIZE RANK`")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def whole_number(number, lowest, highest, named, note=""):
    """``number`` if it is a whole number from ``lowest`` to ``highest`` (None: no bound), else a one-line error
    naming it (``named``: the flag or variable and its value)."""
    if type(number) is not int or number < lowest or (highest is not None and number > highest):
        allowed = f"from {lowest} to {highest}" if highest is not None else f"of {lowest} or more"
        raise ConfigurationError(f"{named}: a whole number {allowed} is allowed{note}")
    return number


def environment_number(name, lowest, highest=None):
    value = os.environ[name]
    number = int(value) if value.strip().removeprefix("-").isdecimal() else None
    return whole_number(number, lowest, highest, f"{name}={value!r} in the environment", f" ({_LEFT_OVER})")


def environment_world():
    """``(host, port, world size, rank)`` from torchrun's variables when all four are set, checked; else None."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    world_size, rank = environment_number("WORLD_SIZE", 1), environment_number("RANK", 0)
    port = environment_number("MASTER_PORT", 1, 65535)
    whole_number(rank, 0, world_size - 1, f"RANK={rank} in the environment with WORLD_SIZE={world_size}",
                 f" ({_LEFT_OVER})")
    host = os.environ["MASTER_ADDR"].strip()
    if not host:
        raise ConfigurationError(f"MASTER_ADDR={os.environ['MASTER_ADDR']!r} in the environment: the address of "
                                 f"rank 0 is needed ({_LEFT_OVER})")
    return host, port, world_size, rank


def is_loopback(host) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
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
    whole_number(port, 1, 65535, f"--distributed-init-method {init_method}", " as its port (tcp://127.0.0.1:PORT)")
    return ("127.0.0.1" if url.hostname == "localhost" else url.hostname), port


def loopback_store(host, port, what, world_size, timeout, wait_for_workers):
    """torch's TCPStore serving on loopback ``host`` only, where torch's own store listens on every interface
    (``port`` 0: a free one); a taken port fails naming ``what``."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does
    try:
        listener.bind((host, port))
        listener.listen(128)
    except OSError as error:
        listener.close()
        raise ConfigurationError(f"{what}: cannot listen on {host}:{port} ({error.strerror}); give a port no other "
                                 "program uses") from None
    return torch.distributed.TCPStore(host, listener.getsockname()[1], world_size, True, timeout,
                                      wait_for_workers=wait_for_workers, master_listen_fd=listener.detach())


def wait_for_listener(host, port, deadline):
    """Wait quietly for a listener at host:port (torch's client logs each failed try with a backtrace)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=5).close()
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens at {host}:{port}") from None
            time.sleep(0.5)


def meet(backend, host, port, rank, world_size, hosts_store, origin):
    """The process group of ``rank``, made before fairseq's ``distributed_init`` (which keeps it): with
    ``hosts_store`` this rank serves the store, on a loopback ``host`` there only, where gloo uses ``lo``
    too. A rendezvous that fails within :data:`RENDEZVOUS_SECONDS` is one line starting with ``origin``."""
    if torch.distributed.is_initialized():
        return  # fairseq keeps using its first group in an interpreter that trains again
    loopback = is_loopback(host)
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ and "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    timeout = datetime.timedelta(seconds=RENDEZVOUS_SECONDS)
    logger.info(f"rank {rank} of {world_size} waits up to {RENDEZVOUS_SECONDS} s for the other ranks at {host}:{port}")
    try:
        if hosts_store and loopback:
            store = loopback_store(host, port, origin, world_size, timeout, wait_for_workers=True)
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
                                 f"{RENDEZVOUS_SECONDS} s (rank {rank}: {reason})") from None
    store.set_timeout(torch.distributed.default_pg_timeout)  # torch's, for the groups fairseq makes later
    warnings.filterwarnings("ignore", message=re.escape(_GROUP_EXISTS))  # fairseq's, finding this group
    logger.info(f"initialized host {socket.gethostname()} as rank {rank}")


def leave_process_group():
    """End the group of one training: a gloo rank exiting with it open can abort as the others close."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def die_with_parent(parent):
    """SIGTERM when the parent ends, however (or at once if it has): no rank trains on alone (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def spawn_cpu_processes(cfg, main, kwargs):
    """One process per rank running fairseq's ``distributed_main``; at a loopback address this process
    serves the store there only, as torchrun's agent does, so a port in use fails at once."""
    distributed = cfg.distributed_training
    world_size, init_method = distributed.distributed_world_size, distributed.distributed_init_method
    if distributed.distributed_rank not in (0, None):
        raise ConfigurationError(f"--distributed-rank {distributed.distributed_rank}: fairseq-train --cpu "
                                 f"--distributed-world-size {world_size} starts ranks 0 to {world_size - 1} itself; "
                                 "give a rank only with --distributed-no-spawn")
    store = None
    if init_method is None:
        port = distributed.distributed_port
        named = f"--distributed-port {port}"
        address = ("127.0.0.1", whole_number(max(port, 0), 0, 65535, named, " (0 or none: a free one)"))
    else:  # an address elsewhere: fairseq's own rendezvous
        address, named = loopback_tcp_address(init_method), f"--distributed-init-method {init_method}"
    if address is not None:
        store = loopback_store(*address, named, None, torch.distributed.default_pg_timeout, wait_for_workers=False)
        host = address[0]
        distributed.distributed_init_method = f"tcp://{f'[{host}]' if ':' in host else host}:{store.port}"
    kwargs["start_rank"] = 0
    distributed.distributed_rank = None  # each process takes its index
    torch.multiprocessing.spawn(run_rank, args=(main, cfg, kwargs, os.getpid(), store is not None),
                                nprocs=world_size, join=True)
    del store  # kept serving until every rank has ended


def run_rank(index, main, cfg, kwargs, parent, meets_at_parent):
    # unpickling this function imported fusion_fairseq already, so fairseq's --user-dir import skips the
    # package and would not register its models in this rank: register them here
    import fusion_fairseq.models  # noqa: F401
    from fusion_fairseq.process_lifetime import end_forked_children_with_this_process

    die_with_parent(parent)
    end_forked_children_with_this_process()  # its DataLoader workers end with it (docs/safety.md)
    distributed = cfg.distributed_training
    if meets_at_parent:
        meet(distributed.distributed_backend, *loopback_tcp_address(distributed.distributed_init_method), index,
             distributed.distributed_world_size, hosts_store=False,
             origin=f"--distributed-world-size {distributed.distributed_world_size}")
    distributed_utils.distributed_main(index, main, cfg, kwargs)
    leave_process_group()


def with_cpu_processes(call_main):
    """``call_main`` that starts the processes of a multi-process training on the CPU."""
    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        distributed = cfg.distributed_training
        world_size, init_method = distributed.distributed_world_size, distributed.distributed_init_method
        whole_number(world_size, 1, None, f"--distributed-world-size {world_size}")
        if cfg.common.tpu or not (cfg.common.cpu or not torch.cuda.is_available()):  # fairseq's Trainer's rule
            return call_main(cfg, main, **kwargs)
        from fusion_fairseq.process_lifetime import end_forked_children_with_this_process

        end_forked_children_with_this_process()  # DataLoader workers and the resource tracker end with it
        if distributed.distributed_backend == "nccl":  # fairseq's default; NCCL moves CUDA tensors only
            distributed.distributed_backend = "gloo"
        world = environment_world() if init_method is None else None  # fairseq's rule
        if world is not None and world[2] > 1:  # what fairseq does for torchrun on GPUs, minus the device id
            host, port, world_size, rank = world
            distributed.distributed_init_method, distributed.distributed_no_spawn = "env://", True
            distributed.distributed_world_size, distributed.distributed_rank = world_size, rank
            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent serves it
            variables = " ".join(f"{name}={os.environ[name]}" for name in TORCHRUN_VARIABLES)
            meet(distributed.distributed_backend, host, port, rank, world_size,
                 hosts_store=rank == 0 and not agent_store, origin=f"the environment's {variables} ({_LEFT_OVER})")
            call_main(cfg, main, **kwargs)
            return leave_process_group()
        if world_size > 1 and not distributed.distributed_no_spawn:
            return spawn_cpu_processes(cfg, main, kwargs)
        address = init_method and loopback_tcp_address(init_method)
        if world_size > 1 and address:  # one rank of a world started by hand
            rank = whole_number(distributed.distributed_rank, 0, world_size - 1,
                                f"--distributed-rank {distributed.distributed_rank}",
                                f" with --distributed-world-size {world_size}")
            meet(distributed.distributed_backend, *address, rank, world_size, hosts_store=rank == 0,
                 origin=f"--distributed-init-method {init_method}")
        return call_main(cfg, main, **kwargs)

    return wrapper


_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters


class DistributedDataParallelOnCpu(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP without device ids for a CPU module (fairseq passes ``[--device-id]`` anyway), and with
    ``broadcast_buffers`` passed as torch >= 2.13's ``forward_sync_buffers`` (no FutureWarning each run;
    torch then broadcasts the buffers once at build, which every rank holds the same)."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(parameter.device.type == "cpu" for parameter in module.parameters()):  # a GPU's DDP stays fairseq's
            device_ids = output_device = None
            if _FORWARD_SYNC and "broadcast_buffers" in kwargs and "forward_sync_buffers" not in kwargs:
                kwargs["forward_sync_buffers"] = kwargs.pop("broadcast_buffers")
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


def train_in_cpu_processes():
    _wrap_once(distributed_utils, "call_main", with_cpu_processes, "_trains_in_cpu_processes")
    distributed_fairseq_model.DistributedDataParallel = DistributedDataParallelOnCpu


# --- bfloat16 without a TPU ------------------------------------------------------------------

def with_bf16_without_tpu(call_main):
    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        if cfg.common.bf16 and cfg.common.tpu and importlib.util.find_spec("torch_xla") is None:
            cfg.common.tpu = False  # fairseq set it for --bf16, and there is no torch_xla to drive a TPU
        return call_main(cfg, main, **kwargs)

    return wrapper


def train_bf16_without_tpu():
    _wrap_once(distributed_utils, "call_main", with_bf16_without_tpu, "_trains_bf16_without_tpu")
