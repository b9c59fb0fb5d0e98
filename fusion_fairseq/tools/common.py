"""Helpers the project's tools and scripts share: argument types, the rule for existing output
files, stand-in dictionaries, parameter counts, the description of the machine a figure was
measured on and the validation curve of a fairseq-train log."""

import json
import os
import pathlib
import platform
import re
import sys
import tempfile
from typing import Dict, List, Optional

from fusion_fairseq.config_fields import NON_NEGATIVE_INT, POSITIVE_INT, argparse_type

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def claim_out_dir(out: str, names, stamp: str, force: bool, tool: str, error) -> None:
    """An --out folder is a tool's own when its stamp file ``.written_by`` (a regular file, not a link) holds
    ``stamp``; one holding any of ``names`` without it is refused unless ``force`` (``raise error(message)``).
    Outputs that are links to files or hard-linked files are removed, so that nothing is written through
    them (a link to a folder is kept: it is written into, not replaced); then the folder is stamped."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise error(f"--out '{out}' is not a directory")
    stamp_path, names = os.path.join(out, ".written_by"), list(dict.fromkeys([*names, ".written_by"]))
    own = (os.path.isfile(stamp_path) and not os.path.islink(stamp_path)
           and pathlib.Path(stamp_path).read_text(encoding="utf-8").splitlines() == [stamp])
    found = [name for name in names if os.path.lexists(os.path.join(out, name))]
    if found and not own and not force:
        raise error(f"--out '{out}' holds files that {tool} did not write: {' '.join(found)}; pass --force to "
                    "replace them, or give another --out")
    for output in (os.path.join(out, name) for name in names):
        if (os.path.islink(output) and not os.path.isdir(output)) or (os.path.isfile(output)
                                                                       and os.stat(output).st_nlink > 1):
            os.remove(output)
    os.makedirs(out, exist_ok=True)
    pathlib.Path(stamp_path).write_text(stamp + "\n", encoding="utf-8")


def replace_atomically(path: str, write) -> None:
    """``write(file)`` into a new binary file created exclusively in ``path``'s directory, then
    ``os.replace`` it onto ``path``: no other file is written (not a ``PATH.tmp`` of the user's, not
    the target of a link named ``path``, which is itself replaced), and a failed write leaves nothing."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's file is private: give it an ordinary file's mode
        with os.fdopen(fd, "wb") as file:
            write(file)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


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


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name, family and model number, and the vector instructions torch's kernels use on
    it (``torch.backends.cpu.get_cpu_capability``). A virtual machine often names no more than "AMD EPYC",
    and two such machines with the same packages trained the same run to losses that part at update 200:
    a run's record has to tell them apart."""
    import torch

    fields: Dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    family = f"family {fields['cpu family']}, model {fields.get('model', '?')}; " if "cpu family" in fields else ""
    return f"{name} ({family}torch {torch.backends.cpu.get_cpu_capability()})"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The instruction-set flags /proc/cpuinfo lists for the first CPU, sorted ("" where it lists none)."""
    try:
        with open(cpuinfo, encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return " ".join(sorted(value.split()))
    except OSError:
        pass
    return ""


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
    """True for a class of this plugin, whether imported as ``fusion_fairseq`` or, through fairseq's
    ``--user-dir``, under its directory's name from the same files."""
    if cls.__module__.split(".")[0] == PLUGIN_PACKAGE:
        return True
    module_file = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
    return os.path.abspath(module_file).startswith(PLUGIN_DIR + os.sep)


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
                curve[int(float(stats["valid_num_updates"]))] = float(stats["valid_nll_loss"])
            except (ValueError, KeyError):
                continue
    return dict(sorted(curve.items()))


def updates_to_reach(curve: Dict[int, float], target: float) -> Optional[int]:
    return next((u for u, nll in sorted(curve.items()) if nll <= target), None)
