"""No process outlives the training that started it (``fusion_fairseq.process_lifetime``): killed with
SIGKILL, a training leaves no DataLoader worker and no resource tracker behind."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from test_distributed import (FAMILY, SPAWNED, data_bin_fixture, fairseq_train_script, live_processes, train_args,
                              wait_for)
from fusion_fairseq.cli import user_dir
from test_fairseq_fixes import running


def descendants(pid):
    """Every live process below ``pid``."""
    parents = {child: parent for child, (parent, _) in live_processes().items()}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_and_count_survivors(command, ready, tmp_path, environment=None):
    """Start ``command``, wait until ``ready(log text)``, SIGKILL it: (its descendants then, those alive 10 s later)."""
    log_path = tmp_path / "process.log"
    with open(log_path, "wb") as log:  # a test's own scratch file
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    below = set()
    try:
        assert wait_for(lambda: ready(log_path.read_text()) or process.poll() is not None, 300)
        assert process.poll() is None, log_path.read_text()[-3000:]
        below = descendants(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        wait_for(lambda: not any(map(running, below)), 10)
        return below, {pid for pid in below if running(pid)}
    finally:
        if process.poll() is None:
            process.kill()
        for pid in below:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


CHILDREN = textwrap.dedent("""
    import multiprocessing, sys, threading, time
    from fusion_fairseq.process_lifetime import end_forked_children_with_this_process

    def wait():  # a child that would wait for ever, as a DataLoader worker whose queue no one reads
        time.sleep(600)

    def start():  # from a thread, as fairseq's prefetching thread starts its workers
        for _ in range(2):
            multiprocessing.Process(target=wait, daemon=False).start()
        print("ready", flush=True)

    if __name__ == "__main__":
        multiprocessing.set_start_method("spawn")  # a rank's default, started by torch.multiprocessing.spawn
        if sys.argv[1] == "ended":
            end_forked_children_with_this_process()
        threading.Thread(target=start).start()
        time.sleep(600)
""")


@pytest.mark.parametrize("ended", [True, False])
def test_children_started_from_a_thread_end_with_their_process(tmp_path, ended):
    """With the hook, both children (forked, though the default was spawn) end within seconds of their
    process's SIGKILL; without it they stay: the case the hook exists for, so that the test can fail."""
    script = tmp_path / "children.py"
    script.write_text(CHILDREN)
    below, survivors = kill_and_count_survivors([sys.executable, str(script), "ended" if ended else "kept"],
                                                lambda log: "ready" in log, tmp_path)
    assert len(below) >= 2, below  # the two children (and, spawning, the resource tracker)
    assert survivors == (set() if ended else below)


#: fairseq-train with the hook called where it belongs: in the training process and in each rank it spawns
#: (fusion_fairseq.fairseq_fixes.run_rank, before fairseq builds its data loaders)
WIRED_TRAIN = textwrap.dedent("""
    import sys
    from argparse import Namespace
    from fairseq import utils

    utils.import_user_module(Namespace(user_dir=sys.argv[1]))  # the plugin as fairseq imports it, models included
    from fusion_fairseq import fairseq_fixes, process_lifetime

    original_run_rank = fairseq_fixes.run_rank

    def run_rank(*args):
        process_lifetime.end_forked_children_with_this_process()
        return original_run_rank(*args)

    if __name__ == "__main__":
        fairseq_fixes.run_rank = run_rank
        process_lifetime.end_forked_children_with_this_process()
        from fairseq_cli.train import cli_main
        sys.argv = ["fairseq-train", *sys.argv[2:]]
        cli_main()
""")


def two_ranks_with_workers(request, tmp_path):
    family = FAMILY[SPAWNED]
    return train_args(family, request.getfixturevalue(data_bin_fixture(family)), str(tmp_path / "checkpoints"),
                      "--distributed-world-size", "2", "--num-workers", "2", "--max-update", "1000000")


@pytest.mark.slow
def test_a_killed_two_rank_training_leaves_no_worker_and_no_resource_tracker(request, tmp_path):
    """``fairseq-train --cpu --distributed-world-size 2 --num-workers 2`` killed with SIGKILL: its ranks, their
    four DataLoader workers and the resource tracker all end within seconds (workers and tracker stayed)."""
    script = tmp_path / "train.py"
    script.write_text(WIRED_TRAIN)
    below, survivors = kill_and_count_survivors(
        [sys.executable, str(script), user_dir(), *two_ranks_with_workers(request, tmp_path)],
        lambda log: "num_updates=2," in log, tmp_path, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert len(below) >= 7, below  # two ranks, four workers, the resource tracker
    assert survivors == set()


@pytest.mark.slow
def test_the_installed_fairseq_train_leaves_no_process_behind(request, tmp_path):
    below, survivors = kill_and_count_survivors(
        [sys.executable, fairseq_train_script(), *two_ranks_with_workers(request, tmp_path)],
        lambda log: "num_updates=2," in log, tmp_path, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert len(below) >= 7 and survivors == set(), (below, survivors)
