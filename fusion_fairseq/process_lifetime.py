"""No process outlives the training that started it (Linux).

fairseq-train's DataLoader workers (``--num-workers``) are forked children of the training process. When
that process is killed they are orphaned, and they do not end: each waits for ever to flush its queue
into a pipe no one reads. multiprocessing's resource tracker, which a multi-process training starts,
ends only once every process holding its pipe has ended, so it stays too.

A forked child therefore watches its parent and ends itself (SIGKILL: there is nothing left to clean up
that anyone would read) as soon as it has been handed to another parent. ``prctl(PR_SET_PDEATHSIG)``
would not do: it fires when the *thread* that forked ends, and fairseq forks its persistent workers from
its prefetching thread (``--data-buffer-size``), which ends with each epoch while the workers serve the
next.
"""

import multiprocessing
import os
import signal
import threading
import time

#: seconds between two looks at the parent: a child ends within this long after its parent
INTERVAL = 0.5

_installed = False


def end_with_parent(interval: float = INTERVAL) -> None:
    """Ends this process once its parent has ended (it was reparented), from a daemon thread."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def end_forked_children_with_this_process() -> None:
    """Every child this process starts through multiprocessing from now on (a DataLoader worker, whichever
    thread starts it) is forked, and ends once this process has ended. Forked: a rank that
    ``torch.multiprocessing.spawn`` started has 'spawn' as its default start method, and a spawned worker
    is a new interpreter that runs no code of the plugin before fairseq's data loading (fork is Linux's
    default, which a one-process fairseq-train uses). Call it in each training process: fairseq-train's
    own, and each rank it spawns (a new interpreter, which inherits neither setting)."""
    global _installed
    if not _installed:
        multiprocessing.set_start_method("fork", force=True)
        os.register_at_fork(after_in_child=end_with_parent)
        _installed = True
