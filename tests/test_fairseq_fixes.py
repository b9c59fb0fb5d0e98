"""The plugin's fixes of fairseq (``fusion_fairseq.fairseq_fixes``): multi-process training on the CPU
(fairseq issue #2879; the pieces here, ``fairseq-train --cpu --distributed-world-size 2`` and torchrun
themselves in ``tests/test_distributed.py``), ``--bf16`` without a TPU (fairseq issue #4696) and the
batches of a resumed training."""

import ipaddress
import os
import signal
import socket
import struct
from argparse import Namespace

import pytest
import torch

import fusion_fairseq.models  # noqa: F401  (registers the plugin)


def test_a_resumed_training_gets_the_batches_of_the_run_it_continues(tiny_data_bin):
    """fairseq-train's training iterator created at epoch 1 (a run trained in one go) and at epoch 3
    (a run resumed from a checkpoint 2 batches into epoch 3, as ``checkpoint_utils.load_checkpoint``
    does): the same batches of the same sentences from there on. Without the fix, sentences of equal
    length fall into other batches of the same sizes."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [tiny_data_bin, "--arch", "transformer"])

    def iterator(epoch, **kwargs):
        task = tasks.setup_task(args)
        task.load_dataset("train")
        return task.get_batch_iterator(task.dataset("train"), max_tokens=200, required_batch_size_multiple=1,
                                       seed=1, epoch=epoch, **kwargs)

    unbroken, resumed = iterator(1), iterator(3)
    for _ in range(2):
        assert sum(1 for _ in unbroken.next_epoch_itr()) > 2
    resumed.load_state_dict({"version": 2, "epoch": 3, "iterations_in_epoch": 2, "shuffle": True})
    for skipped in (2, 0):  # the rest of epoch 3, then epoch 4
        expected = [b["id"].tolist() for b in unbroken.next_epoch_itr()][skipped:]
        assert [b["id"].tolist() for b in resumed.next_epoch_itr()] == expected
    assert resumed.epoch == unbroken.epoch == 4
    rebuilt = iterator(3, disable_iterator_cache=True)  # built anew each epoch: fairseq's own batches of epoch 3
    assert [list(b) for b in rebuilt.frozen_batches] != [list(b) for b in unbroken.frozen_batches]


# --------------------------------------------------------------------------- training in CPU processes


def cpu_training_config(*flags):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["unused-data", "--arch", "transformer", "--cpu", *flags])
    return convert_namespace_to_omegaconf(args)


TORCHRUN_ENVIRONMENT = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "1"}


def set_environment(monkeypatch, variables):
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "GLOO_SOCKET_IFNAME"):  # the second set by a rendezvous here
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def one_line_refusal(call, *names):
    """``call()`` raises a ConfigurationError: its one-line message, which names each of ``names``."""
    from fusion_fairseq.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, (name, message)
    return message


@pytest.mark.parametrize("rank,agent,hosts", [("1", None, False), ("0", None, True), ("0", "True", False)])
def test_torchrun_world_is_joined_on_cpu(rank, agent, hosts, monkeypatch):
    """Under torchrun (its variables set), the CPU training joins torchrun's world instead of
    training alone: env:// rendezvous, world size and rank from the environment, no spawning.
    Rank 0 serves the store unless torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE``)."""
    from fusion_fairseq import fairseq_fixes

    set_environment(monkeypatch, {**TORCHRUN_ENVIRONMENT, "RANK": rank})
    if agent:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent)
    meetings, seen = [], []
    monkeypatch.setattr(fairseq_fixes, "meet", lambda *args, **kwargs: meetings.append((args, kwargs)),
                        raising=False)
    fairseq_fixes.with_cpu_processes(lambda cfg, main: seen.append(cfg.distributed_training))(cpu_training_config(),
                                                                                               None)
    joined = seen[0]
    assert joined.distributed_init_method == "env://"
    assert (joined.distributed_world_size, joined.distributed_rank) == (2, int(rank))
    assert joined.distributed_no_spawn and joined.distributed_backend == "gloo"
    (args, kwargs), = meetings
    assert args == ("gloo", "127.0.0.1", 1, int(rank), 2) and kwargs["hosts_store"] is hosts


@pytest.mark.parametrize("name,value", [
    ("WORLD_SIZE", "abc"), ("WORLD_SIZE", ""), ("WORLD_SIZE", "2.0"), ("WORLD_SIZE", "0"), ("WORLD_SIZE", "-2"),
    ("WORLD_SIZE", "0x2"), ("RANK", "one"), ("RANK", "-1"), ("RANK", "2"), ("RANK", "7"), ("MASTER_PORT", "http"),
    ("MASTER_PORT", "0"), ("MASTER_PORT", "65536"), ("MASTER_PORT", "-29500"), ("MASTER_ADDR", ""),
    ("MASTER_ADDR", "  "),
])
def test_a_bad_torchrun_environment_is_refused_before_anything_waits(name, value, monkeypatch):
    """torchrun's variables (as a shell keeps them after ``export``) that are no numbers, out of range,
    or a rank outside the world: one line naming the variable and value, before any rendezvous
    (fairseq gave a traceback, or waited for a rank that cannot exist)."""
    from fusion_fairseq import fairseq_fixes

    set_environment(monkeypatch, {**TORCHRUN_ENVIRONMENT, name: value})
    monkeypatch.setattr(fairseq_fixes, "meet", lambda *args, **kwargs: pytest.fail("met"), raising=False)
    called = []
    wrapped = fairseq_fixes.with_cpu_processes(lambda cfg, main: called.append(cfg))
    message = one_line_refusal(lambda: wrapped(cpu_training_config(), None), "unset")
    assert f"{name}={value!r}" in message or f"{name}={value} " in message, message
    assert called == []


def test_torchrun_variables_are_not_read_with_an_init_method(monkeypatch):
    """fairseq reads torchrun's variables only without --distributed-init-method; so does the check."""
    from fusion_fairseq import fairseq_fixes

    set_environment(monkeypatch, {**TORCHRUN_ENVIRONMENT, "WORLD_SIZE": "abc"})
    called = []
    fairseq_fixes.with_cpu_processes(lambda cfg, main: called.append(cfg))(
        cpu_training_config("--distributed-init-method", "tcp://192.0.2.1:29500"), None)
    assert len(called) == 1


@pytest.mark.parametrize("rank", ["0", "1"])
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_stale_torchrun_environment_fails_at_the_rendezvous_timeout(rank, host, monkeypatch):
    """torchrun's variables left in a shell, no other rank: rank 1 finds no store, rank 0 no
    other rank. Both stop after the rendezvous timeout (60 s, shortened here) in one line naming
    the variables, where fairseq waited 30 minutes without a word; nothing is left listening."""
    from fusion_fairseq import fairseq_fixes

    port = free_local_port()
    set_environment(monkeypatch, {"MASTER_ADDR": host, "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": rank})
    monkeypatch.setattr(fairseq_fixes, "RENDEZVOUS_SECONDS", 2, raising=False)
    called = []
    wrapped = fairseq_fixes.with_cpu_processes(lambda cfg, main: called.append(cfg))
    message = one_line_refusal(lambda: wrapped(cpu_training_config(), None),
                               f"MASTER_ADDR={host} MASTER_PORT={port} WORLD_SIZE=2 RANK={rank}", "within 2 s", "unset")
    assert called == [] and not torch.distributed.is_initialized()
    socket.create_server(("127.0.0.1", port)).close()  # rank 0's store is gone


def free_local_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn_recorder(monkeypatch):
    """Replace torch's spawn with a recorder of (nprocs, args, init method while spawning)."""
    from fusion_fairseq import fairseq_fixes

    spawned = []

    def spawn(function, args, nprocs, join):
        cfg = args[1]
        spawned.append((nprocs, args, cfg.distributed_training.distributed_init_method, listening_sockets()))

    monkeypatch.setattr(fairseq_fixes.torch.multiprocessing, "spawn", spawn)
    return spawned


def listening_sockets(pid="self"):
    """(address, port) of every TCP socket of process ``pid`` in the LISTEN state (Linux's /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if fields[3] != "0A" or fields[9] not in inodes:
                    continue
                address, port = fields[1].split(":")
                raw = b"".join(struct.pack("<I", int(address[i:i + 8], 16)) for i in range(0, len(address), 8))
                found.append((str(ipaddress.ip_address(raw[:width])), int(port, 16)))
    return found


@pytest.mark.parametrize("flags", [[], ["--distributed-port", "PORT"],
                                   ["--distributed-init-method", "tcp://127.0.0.1:PORT"],
                                   ["--distributed-init-method", "tcp://localhost:PORT"],
                                   ["--distributed-init-method", "tcp://[::1]:PORT"]])
def test_spawned_ranks_meet_at_a_store_on_loopback_only(flags, monkeypatch):
    """fairseq-train --cpu --distributed-world-size 2: this process serves the ranks' store on
    127.0.0.1 only (torch's own listened on every interface, IPv4 and IPv6, for anyone to join),
    at the port asked for or a free one, until the ranks end; each rank is told this process's id."""
    port = free_local_port()
    spawned = spawn_recorder(monkeypatch)
    before = listening_sockets()
    from fusion_fairseq import fairseq_fixes

    flags = [flag.replace("PORT", str(port)) for flag in flags]
    fairseq_fixes.with_cpu_processes(lambda cfg, main: pytest.fail("no spawn"))(
        cpu_training_config("--distributed-world-size", "2", *flags), None)
    (nprocs, args, init_method, listening), = spawned
    address, chosen = init_method.removeprefix("tcp://").rsplit(":", 1)
    loopback = "::1" if "::1" in " ".join(flags) else "127.0.0.1"
    assert nprocs == 2 and address.strip("[]") == loopback and (chosen == str(port) or not flags)
    assert sorted(set(listening) - set(before)) == [(loopback, int(chosen))]
    assert args[3] == os.getpid() and args[4] is True
    assert sorted(listening_sockets()) == sorted(before)  # the store ended with the ranks


def busy_port(address="127.0.0.1"):
    holder = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    holder.bind((address, 0))
    holder.listen()
    return holder


@pytest.mark.parametrize("holder_address", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize("flag,template", [("--distributed-port", "{port}"),
                                           ("--distributed-init-method", "tcp://127.0.0.1:{port}"),
                                           ("--distributed-init-method", "tcp://localhost:{port}")])
def test_a_port_in_use_is_refused_before_spawning(flag, template, holder_address, monkeypatch):
    """A --distributed-port (or a loopback init method's port) another program listens on: one line
    naming the flag and value, before any rank starts (fairseq spawned the ranks, which failed
    with tracebacks after a wait)."""
    spawned = spawn_recorder(monkeypatch)
    from fusion_fairseq import fairseq_fixes

    with busy_port(holder_address) as holder:
        value = template.format(port=holder.getsockname()[1])
        wrapped = fairseq_fixes.with_cpu_processes(lambda cfg, main: pytest.fail("trained"))
        one_line_refusal(lambda: wrapped(cpu_training_config("--distributed-world-size", "2", flag, value), None),
                         f"{flag} {value}:", "in use")
    assert spawned == []


@pytest.mark.parametrize("flags,named", [
    (["--distributed-port", "65536"], "--distributed-port 65536:"),
    (["--distributed-port", "100000"], "--distributed-port 100000:"),
    (["--distributed-init-method", "tcp://127.0.0.1"], "--distributed-init-method tcp://127.0.0.1:"),
    (["--distributed-init-method", "tcp://127.0.0.1:0"], "--distributed-init-method tcp://127.0.0.1:0:"),
    (["--distributed-init-method", "tcp://127.0.0.1:port"], "--distributed-init-method tcp://127.0.0.1:port:"),
    (["--distributed-init-method", "tcp://localhost:70000"], "--distributed-init-method tcp://localhost:70000:"),
    (["--distributed-rank", "1"], "--distributed-rank 1:"),
    (["--distributed-rank", "5"], "--distributed-rank 5:"),
])
def test_bad_addresses_and_ranks_are_refused_before_spawning(flags, named, monkeypatch):
    spawned = spawn_recorder(monkeypatch)
    from fusion_fairseq import fairseq_fixes

    wrapped = fairseq_fixes.with_cpu_processes(lambda cfg, main: pytest.fail("trained"))
    one_line_refusal(lambda: wrapped(cpu_training_config("--distributed-world-size", "2", *flags), None), named)
    assert spawned == []


@pytest.mark.parametrize("rank", ["2", "9"])
def test_a_rank_outside_the_world_is_refused_without_spawning(rank, monkeypatch):
    """One rank of a world started by hand (--distributed-no-spawn) whose rank cannot exist."""
    from fusion_fairseq import fairseq_fixes

    wrapped = fairseq_fixes.with_cpu_processes(lambda cfg, main: pytest.fail("trained"))
    flags = ("--distributed-world-size", "2", "--distributed-no-spawn", "--distributed-rank", rank,
             "--distributed-init-method", f"tcp://127.0.0.1:{free_local_port()}")
    one_line_refusal(lambda: wrapped(cpu_training_config(*flags), None), f"--distributed-rank {rank}:", "0 to 1")


def test_a_spawned_rank_ends_with_its_parent():
    """A process that called ``die_with_parent`` is sent SIGTERM when its parent ends, even by
    SIGKILL (fairseq-train's ranks trained on as orphans; end to end in ``test_distributed.py``)."""
    import subprocess
    import sys
    import time

    child = ("import os, sys, time; from fusion_fairseq.fairseq_fixes import die_with_parent; "
             "die_with_parent(os.getppid()); print(os.getpid(), flush=True); time.sleep(60)")
    parent = ("import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
              "child.wait()")
    launcher = subprocess.Popen([sys.executable, "-c", parent, child], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONWARNINGS": "ignore"})
    grandchild = None
    try:
        grandchild = int(launcher.stdout.readline())
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 20
        while running(grandchild) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running(grandchild)
    finally:
        launcher.kill()
        launcher.wait(timeout=30)
        if grandchild and running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def running(pid):
    """The process exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("broadcast_buffers", [False, True])
def test_ddp_backend_c10d_wraps_a_cpu_model(broadcast_buffers, tmp_path, monkeypatch):
    """fairseq's ``DistributedFairseqModel`` for --ddp-backend c10d passes ``device_ids=[0]``,
    which torch refuses for a CPU module (``ValueError``); with the plugin the CPU model trains.
    fairseq's ``--broadcast-buffers`` reaches DDP as its replacement in torch >= 2.13, without
    the ``broadcast_buffers is deprecated`` FutureWarning, and keeps its value."""
    import sys
    import warnings

    import torch
    import torch.distributed as dist
    from fairseq import models

    args = Namespace(tpu=False, ddp_backend="c10d", device_id=0, broadcast_buffers=broadcast_buffers,
                     bucket_cap_mb=25, find_unused_parameters=False, gradient_as_bucket_view=False,
                     ddp_comm_hook="none")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # init_process_group wraps it; restored after the test
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning, the FutureWarning included, fails the test
            wrapped = models.DistributedFairseqModel(args, torch.nn.Linear(3, 2), dist.group.WORLD,
                                                     torch.device("cpu"))
        # no_sync: a gradient all-reduce still being torn down in gloo's thread when the test
        # ends can deadlock torch as it frees DDP (its thread waits for the GIL that the joining
        # main thread holds)
        with wrapped.no_sync():
            wrapped(torch.ones(4, 3)).sum().backward()
        assert wrapped.weight.grad is not None  # the proxy reaches the wrapped module
        assert wrapped.module.broadcast_buffers is broadcast_buffers  # torch's name of the same setting
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", ["0", "-1", "-8"])
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_world_of_no_process_is_refused(world_size, device, monkeypatch):
    """fairseq spawns ``min(GPUs, world size)`` processes: 0 or a negative size trained nothing and
    exited 0. Refused in one line naming the flag and the value, on the CPU and a GPU alike."""
    from fusion_fairseq import fairseq_fixes
    from fusion_fairseq.errors import ConfigurationError

    cfg = cpu_training_config("--distributed-world-size", world_size)
    if device == "gpu":
        cfg.common.cpu = False
        monkeypatch.setattr(fairseq_fixes.torch.cuda, "is_available", lambda: True)
    seen = []
    with pytest.raises(ConfigurationError) as refused:
        fairseq_fixes.with_cpu_processes(lambda cfg, main: seen.append(cfg))(cfg, None)
    message = str(refused.value)
    assert f"--distributed-world-size {world_size}:" in message and "1 or more" in message
    assert "\n" not in message and seen == []


def test_other_ranks_read_the_broadcast_checkpoint():
    """Resuming on several ranks, rank 0 broadcasts the checkpoint pickled with
    ``_TensorPlaceholder`` for its tensors; the other ranks' ``torch.load`` (weights only) reads it."""
    import io

    import torch
    from fairseq.distributed import utils as distributed_utils

    tensors = []
    state = distributed_utils._split_tensors_from_obj({"model": {"w": torch.ones(2)}, "step": 3}, tensors)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu")
    assert distributed_utils._put_tensors_in_obj(loaded, tensors)["model"]["w"].tolist() == [1.0, 1.0]


# --------------------------------------------------------------------------- bfloat16 without a TPU


def test_bf16_trains_without_a_tpu(monkeypatch):
    """fairseq's options turn ``--bf16`` into a TPU run; where torch_xla is missing the flag is cleared
    before fairseq's ``call_main`` builds the Trainer (``fairseq-train --bf16`` end to end, on the
    CPU, in ``tests/test_gpu_training.py``)."""
    from fairseq.distributed import utils as distributed_utils

    cfg = cpu_training_config("--bf16")
    assert cfg.common.tpu  # fairseq's doing (issue #4696)
    seen = []
    monkeypatch.setattr(distributed_utils, "call_main", lambda cfg, main: seen.append(cfg.common.tpu))
    from fusion_fairseq.fairseq_fixes import train_bf16_without_tpu

    train_bf16_without_tpu()
    distributed_utils.call_main(cfg, None)
    assert seen == [False] and cfg.common.bf16


def test_an_explicit_tpu_run_is_left_to_fairseq_where_torch_xla_is_installed(monkeypatch):
    from fusion_fairseq import fairseq_fixes

    cfg = cpu_training_config("--bf16")
    monkeypatch.setattr(fairseq_fixes.importlib.util, "find_spec", lambda name: object())
    seen = []
    fairseq_fixes.with_bf16_without_tpu(lambda cfg, main: seen.append(cfg.common.tpu))(cfg, None)
    assert seen == [True]
