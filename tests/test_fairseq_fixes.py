"""The plugin's fixes of fairseq (``fusion_fairseq.fairseq_fixes``): every sentence in its batches
(fairseq issue #5036); multi-process training on the CPU (the pieces here; ``fairseq-train --cpu
--distributed-world-size 2`` and torchrun themselves in ``tests/test_distributed.py``); ``--bf16``
without a TPU (fairseq issue #4696)."""

from argparse import Namespace

import numpy as np
import pytest
from fairseq.data import data_utils

import fusion_fairseq  # noqa: F401  (installs the fix)
from fusion_fairseq.fairseq_fixes import with_last_partial_batch


def flat(batches):
    return [int(i) for batch in batches for i in batch]


@pytest.mark.parametrize("max_sentences,max_tokens", [(16, None), (None, None), (None, 40)])
def test_batch_by_size_keeps_the_last_partial_batch(max_sentences, max_tokens):
    """30 sentences with the default multiple of 8: fairseq alone keeps 24 (or fewer); with the
    plugin every index is batched once, in order, and the full batches are fairseq's own."""
    indices = np.arange(30, dtype=np.int64)
    sizes = np.full(30, 3, dtype=np.int64)
    batches = data_utils.batch_by_size(indices, lambda i: 3, num_tokens_vec=sizes, max_tokens=max_tokens,
                                       max_sentences=max_sentences, required_batch_size_multiple=8)
    assert flat(batches) == list(range(30))
    assert all(len(batch) % 8 == 0 for batch in batches[:-1])
    assert len(batches[-1]) == 30 - 8 * (30 // 8) or len(batches) == 1


def test_batch_by_size_keeps_iterator_input_and_is_installed_once():
    batches = data_utils.batch_by_size(iter(range(13)), lambda i: 1, max_sentences=8, required_batch_size_multiple=8)
    assert flat(batches) == list(range(13)) and [len(b) for b in batches] == [8, 5]
    before = data_utils.batch_by_size
    fusion_fairseq.fairseq_fixes.keep_last_partial_batch()
    assert data_utils.batch_by_size is before


def test_batches_of_a_multiple_are_unchanged():
    original = data_utils.batch_by_size.__wrapped__
    sizes = np.full(32, 3, dtype=np.int64)
    expected = original(np.arange(32), None, num_tokens_vec=sizes, max_sentences=16, required_batch_size_multiple=8)
    actual = with_last_partial_batch(original)(np.arange(32), None, num_tokens_vec=sizes, max_sentences=16,
                                               required_batch_size_multiple=8)
    assert [list(b) for b in actual] == [list(b) for b in expected] == [list(range(16)), list(range(16, 32))]


def test_translation_task_iterates_every_training_sentence(tiny_data_bin):
    """fairseq's own task machinery (what fairseq-train, -validate and -generate use) with its
    default --required-batch-size-multiple 8: every one of the 300 training and 30 validation
    sentences is in an epoch."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [tiny_data_bin, "--arch", "transformer", "--max-tokens", "1000"])
    assert args.required_batch_size_multiple == 8
    task = tasks.setup_task(args)
    for split, count in (("train", 300), ("valid", 30)):
        task.load_dataset(split)
        iterator = task.get_batch_iterator(task.dataset(split), max_tokens=1000, max_sentences=32,
                                           required_batch_size_multiple=8).next_epoch_itr(shuffle=False)
        seen = sorted(int(i) for batch in iterator for i in batch["id"])
        assert seen == list(range(count)), split


# --------------------------------------------------------------------------- training in CPU processes


def cpu_training_config(*flags):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["unused-data", "--arch", "transformer", "--cpu", *flags])
    return convert_namespace_to_omegaconf(args)


def test_torchrun_world_is_joined_on_cpu(monkeypatch):
    """Under torchrun (its variables set), the CPU training joins torchrun's world instead of
    training alone: env:// rendezvous, world size and rank from the environment, no spawning."""
    from fusion_fairseq.fairseq_fixes import with_cpu_processes

    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    seen = []
    with_cpu_processes(lambda cfg, main: seen.append(cfg.distributed_training))(cpu_training_config(), None)
    joined = seen[0]
    assert (joined.distributed_init_method, joined.distributed_world_size, joined.distributed_rank) == ("env://", 2, 1)
    assert joined.distributed_no_spawn and joined.distributed_backend == "gloo"


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
