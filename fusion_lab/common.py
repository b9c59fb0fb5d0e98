"""Helpers the project's tools and scripts share: argument types, the one way to write a file
(:func:`replace_atomically`) and to claim a folder (:func:`claim_out_dir`), stand-in dictionaries, parameter counts, the description of the machine a figure was
measured on and the validation curve of a fairseq-train log."""

import contextlib
import json
import os
import pathlib
import platform
import re
import shutil
import stat
import sys
import tempfile
from typing import Dict, List, Optional

from fusion_fairseq.cli import user_dir
from fusion_fairseq.config_fields import NON_NEGATIVE_INT, POSITIVE_INT, argparse_type

PLUGIN_DIR = user_dir()  # what --user-dir names: the package that registers the plugin
PLUGIN_PACKAGE = "fusion_fairseq"

#: fairseq's batches made in the calling thread: a loading process (--num-workers) forked from a threaded caller
#: waits up to 5 s to be shut down, and fairseq's prefetching daemon thread (--data-buffer-size), if still collating
#: at the interpreter's exit, aborts a finished run (Python 3.11: "terminate called without an active exception").
BATCHES_IN_THREAD = ("--num-workers", "0", "--data-buffer-size", "0")


positive_int = argparse_type(POSITIVE_INT)
non_negative_int = argparse_type(NON_NEGATIVE_INT)


def refuse_existing_output(flag: str, path: str, force: bool, error: type = FileExistsError) -> None:
    """An existing output file (a link too, even a dangling one) is never replaced unless the user passes --force."""
    if os.path.lexists(path) and not force:
        raise error(f"{flag} {path} exists; pass --force to overwrite it, or give another name")


def trust_problem(path: str) -> Optional[str]:
    """Why ``path`` is not this user's own, judged as ssh judges a key file: it is a symbolic link, another
    user owns it, or group or others may write it. None when it is trusted."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by the user running this (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"is writable by {'group' if info.st_mode & 0o020 else 'others'} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


STAMP = ".written_by"


def stamped(folder: str, stamp: str) -> bool:
    """A tool's own folder: trusted (:func:`trust_problem`, the folder a user-named link leads to), holding a
    trusted regular file ``.written_by`` whose one line is ``stamp``."""
    path = os.path.join(folder, STAMP)
    return (os.path.isdir(folder) and trust_problem(os.path.realpath(folder)) is None and os.path.lexists(path)
            and trust_problem(path) is None and stat.S_ISREG(os.lstat(path).st_mode)
            and pathlib.Path(path).read_text(encoding="utf-8", errors="replace").splitlines() == [stamp])


def claim_out_dir(out: str, names, stamp: str, force: bool, tool: str, error, flag: str = "--out") -> None:
    """Make ``out`` a tool's own folder before anything is written into it. A folder that is not the tool's
    (:func:`stamped`) is written into only when it is empty, or with ``force``; else ``raise error(message)``
    naming what it holds (first the tool's ``names``). Then the ``names`` that are links, or files with other
    hard links, are removed, so that a program writing them (fairseq) makes new files instead of writing
    through them, after the folder is made if needed and closed to group and others' writes (so that no one
    else can put a link back meanwhile); then it is stamped."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise error(f"{flag} '{out}' is not a directory")
    names = list(dict.fromkeys([*names, STAMP]))
    if os.path.isdir(out) and not stamped(out, stamp):
        found = [name for name in names if os.path.lexists(os.path.join(out, name))] or sorted(os.listdir(out))
        if found and not force:
            shown = " ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
            raise error(f"{flag} '{out}' holds files that {tool} did not write: {shown}; pass --force to replace "
                        f"them, or give another {flag}")
    make_own_folder(out)
    remove_links(out, names)
    write_file(os.path.join(out, STAMP), stamp + "\n")
    os.chmod(os.path.join(out, STAMP), 0o644)  # trusted whatever the umask


#: what fairseq writes by name: fairseq-train into its --save-dir (checkpoint_utils' checkpoints, with any
#: --checkpoint-suffix, their .tmp files, and "dummy", the probe that the folder is writable; the recipes'
#: FAIRSEQ_TRAIN_NAMES in examples/train-common.sh), fairseq-generate into its --results-path
FAIRSEQ_TRAIN_WRITES = re.compile(r"checkpoint([0-9]|_[0-9]+_[0-9]|_best|\.best_|_last).*\.pt(\.tmp)?|dummy")
FAIRSEQ_GENERATE_WRITES = re.compile(r"generate-.*")


def folder_without_links(path: str, writes: "re.Pattern[str]") -> None:
    """``path`` as a folder a program (fairseq) writes files into by their names, ``writes`` matching them: a
    link named ``path`` is removed and the folder made, then the links and hard-linked files among those names
    removed, so that what it writes makes new files; every other file there stays."""
    if os.path.islink(path):
        os.remove(path)
    make_own_folder(path)
    remove_links(path, [name for name in os.listdir(path) if writes.fullmatch(name)])


def remove_links(folder: str, names) -> None:
    """The ``names`` in ``folder`` that are symbolic links (to a file or a folder) or files with other hard links,
    removed; what they lead to stays. A program that then writes them (fairseq) makes new files instead of
    writing through them."""
    for path in (os.path.join(folder, name) for name in names):
        if os.path.islink(path) or (os.path.isfile(path) and os.stat(path).st_nlink > 1):
            os.remove(path)


def make_own_folder(path: str) -> None:
    """``path`` made if missing, then closed to group and others' writes, so that :func:`trust_problem`
    trusts it (a link the user named is followed: the folder it leads to is closed)."""
    os.makedirs(path, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        os.chmod(path, mode & ~0o022)


def replace_atomically(path: str, write, keep_partial: bool = False) -> None:
    """Every file the project writes is written here: ``write(file)`` into a new binary file created
    exclusively in ``path``'s directory, then ``os.replace`` it onto ``path``. No other file is written (not
    a ``PATH.tmp`` of the user's, not the target of a link named ``path``, which is itself replaced, not a
    file hard-linked to ``path``, whose other names keep their content), and a failed write leaves nothing
    (``keep_partial``: a log, whose partial content still replaces ``path``)."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's file is private: give it an ordinary file's mode
        with os.fdopen(fd, "wb") as file:
            write(file)
    except BaseException:
        if keep_partial:
            move_into_place(temporary, path)
        else:
            os.unlink(temporary)
        raise
    move_into_place(temporary, path)


def move_into_place(temporary: str, path: str) -> None:
    """``os.replace(temporary, path)``; where it fails (``path`` a folder, a folder others may write), the
    temporary file is removed before the error goes on."""
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def python_module_command(module: str) -> List[str]:
    """``python -m module`` with this interpreter, importing nothing from the working directory: ``-P``
    (Python 3.11 and later); older Pythons run the module through runpy with the working directory taken
    off ``sys.path``."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    return [sys.executable, "-c", "import runpy, sys; sys.path.remove(''); "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"]


def copy_file(source: str, path: str) -> None:
    """``source``'s bytes as the new content of ``path``, by :func:`replace_atomically`."""
    with open(source, "rb") as original:
        replace_atomically(path, lambda file: shutil.copyfileobj(original, file))


def append_to_log(path: str):
    """``path`` opened to append to (a log kept across sessions, made if missing), never through a link
    (refused by the kernel: ELOOP) nor into a file with other hard links."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        raise OSError(f"{path} has other hard links: not appended to")
    return os.fdopen(fd, "a", encoding="utf-8")


def write_file(path: str, data) -> None:
    """``data`` (text, written as UTF-8, or bytes) as the whole new content of ``path``, by :func:`replace_atomically`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    replace_atomically(path, lambda file: file.write(payload))


def dictionary_of_size(size: int):
    """A fairseq Dictionary whose ``len`` is ``size`` (its special symbols included)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for index in range(size - len(dictionary)):
        dictionary.add_symbol(f"tok{index}")
    return dictionary


def count_parameters(model) -> int:
    """Every parameter once (shared tensors once), as fairseq logs "num. shared model params"."""
    return sum(p.numel() for p in model.parameters())


def first_cpu_fields(cpuinfo: str = "/proc/cpuinfo") -> Dict[str, str]:
    """The ``key: value`` fields of /proc/cpuinfo, each at its first occurrence: the first CPU's; empty where the
    file cannot be read."""
    fields: Dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name, family and model number, and the vector instructions torch's kernels use on
    it (``torch.backends.cpu.get_cpu_capability``). A virtual machine often names no more than "AMD EPYC",
    and two such machines with the same packages trained the same run to losses that part at update 200:
    a run's record has to tell them apart."""
    import torch

    fields = first_cpu_fields(cpuinfo)
    name = fields.get("model name") or platform.processor() or platform.machine()
    family = f"family {fields['cpu family']}, model {fields.get('model', '?')}; " if "cpu family" in fields else ""
    return f"{name} ({family}torch {torch.backends.cpu.get_cpu_capability()})"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The instruction-set flags /proc/cpuinfo lists for the first CPU, sorted ("" where it lists none)."""
    return " ".join(sorted(first_cpu_fields(cpuinfo).get("flags", "").split()))


def tree_sha256(paths: List[str]) -> str:
    """One sha256 over the files ``paths`` (names and contents, in sorted order): a data set's identity."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def device_name(device) -> str:
    """The GPU's name for a CUDA device (a ``torch.device`` or "cuda"), else the CPU as ``cpu_name`` names it."""
    import torch

    if str(getattr(device, "type", device)) == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device if hasattr(device, "type") else None)
    return cpu_name()


def load_average() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def defined_in_plugin(cls) -> bool:
    """True for a class of this plugin (its package loads under no other name: fusion_fairseq/__init__.py)."""
    return cls.__module__.split(".")[0] == PLUGIN_PACKAGE


def plugin_architectures(registry: Optional[Dict[str, type]] = None) -> List[str]:
    """The architectures whose model class is this plugin's, in registration order (fairseq's
    ``ARCH_MODEL_REGISTRY`` unless ``registry`` is given), so that later model families are found
    without editing a list."""
    if registry is None:
        from fairseq.models import ARCH_MODEL_REGISTRY as registry
    return [arch for arch, model_cls in registry.items() if defined_in_plugin(model_cls)]


VALID_LINE = re.compile(r"\|\s*valid\s*\|\s*(\{.*\})\s*$")


def learning_curve(log_path: str) -> Dict[int, float]:
    """{update: validation NLL (bits)} from the validation lines of a fairseq-train log; a resumed run's
    repeated updates: the latest value."""
    curve: Dict[int, float] = {}
    if not os.path.isfile(log_path):
        return curve
    with open(log_path, encoding="utf-8", errors="replace") as log:
        for m in filter(None, map(VALID_LINE.search, log)):
            try:
                stats = json.loads(m.group(1))
                # cross_entropy logs its NLL (bits) as the loss alone
                nll = stats["valid_nll_loss"] if "valid_nll_loss" in stats else stats["valid_loss"]
                curve[int(float(stats["valid_num_updates"]))] = float(nll)
            except (ValueError, KeyError):
                continue
    return dict(sorted(curve.items()))


def updates_to_reach(curve: Dict[int, float], target: float) -> Optional[int]:
    return next((u for u, nll in sorted(curve.items()) if nll <= target), None)
