"""Checkpoint averaging: one checkpoint whose parameters are the mean of several (the last five, in
the Transformer setups the papers follow). fairseq's own ``scripts/average_checkpoints.py`` is not
in its pip package.

    python scripts/average_checkpoints.py --dir checkpoints/vanilla --last 5 --output averaged.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt --output averaged.pt
"""

import argparse
import os
import sys
from typing import List, Optional, Sequence

from fusion_lab.common import refuse_existing_output, replace_atomically

EPOCH_CHECKPOINT, UPDATE_CHECKPOINT = r"checkpoint(\d+)\.pt", r"checkpoint_\d+_(\d+)\.pt"


def average_checkpoints(paths: Sequence[str], out: str) -> str:
    """Write to ``out`` (atomically) the last of ``paths`` with the mean of their parameters (in float64,
    stored in each one's dtype) and no optimizer state, which no decoder reads. Returns ``out``. A
    ValueError names a checkpoint of another model than the last one's (a mean of two models is a third):
    another structural configuration, other parameter names or shapes; a file fairseq's loaders refuse (not a
    checkpoint, a weight that is NaN or infinite) is refused as they refuse it, naming the file."""
    import torch

    import fusion_fairseq.models  # noqa: F401  (registers the plugin; reads fairseq checkpoints under torch >= 2.6)
    from fusion_fairseq.checkpoint_safety import (
        read_checkpoint_state, require_finite_weights, stored_model_config, structural_differences,
    )

    states = [read_checkpoint_state(path) for path in paths]
    for path, state in zip(paths, states):
        require_finite_weights(state, path)
    last, last_path = states[-1], paths[-1]
    for path, state in zip(paths, states):
        for field, value, expected in structural_differences(stored_model_config(state), stored_model_config(last)):
            raise ValueError(f"{path} was trained with {field} {value!r} but {last_path} with {expected!r}; "
                             "average checkpoints of one model")
        if list(state["model"]) != list(last["model"]):
            raise ValueError(f"{path}: its parameters are not those of {last_path}; average checkpoints of one model")
        for name, tensor in state["model"].items():
            if tensor.shape != last["model"][name].shape:
                raise ValueError(f"{path}: parameter {name} has shape {list(tensor.shape)} but "
                                 f"{list(last['model'][name].shape)} in {last_path}; average checkpoints of one model")
    averaged = dict(last, last_optimizer_state=None)
    averaged["model"] = {name: (sum(state["model"][name].double() for state in states) / len(states))
                         .to(tensor.dtype) for name, tensor in last["model"].items()}
    replace_atomically(out, lambda temporary: torch.save(averaged, temporary))
    return out


def last_checkpoints(directory: str, count: int, by_update: bool = False) -> List[str]:
    """The ``count`` newest epoch checkpoints (``checkpointN.pt``) of ``directory``, or with
    ``by_update`` its newest interval checkpoints (``checkpoint_E_U.pt``), oldest first."""
    from fairseq.checkpoint_utils import checkpoint_paths  # newest first

    return checkpoint_paths(directory, UPDATE_CHECKPOINT if by_update else EPOCH_CHECKPOINT)[:count][::-1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="average_checkpoints.py", description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--inputs", nargs="+", help="the checkpoints to average")
    which.add_argument("--dir", help="a fairseq --save-dir: average its --last newest checkpoints")
    p.add_argument("--last", type=int, default=None, help="with --dir: how many (default: 5)")
    p.add_argument("--by-update", action="store_true",
                   help="with --dir: the interval checkpoints checkpoint_E_U.pt instead of the epoch ones")
    p.add_argument("--output", required=True, help="the averaged checkpoint to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output (never one of the inputs)")
    return p


def fail(message: str):
    sys.exit(f"average_checkpoints.py: error: {message}")


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = build_parser().parse_args(argv)
    inputs = args.inputs
    if args.inputs is not None and (args.last is not None or args.by_update):
        fail(f"{'--last' if args.last is not None else '--by-update'} picks the checkpoints of --dir; with --inputs "
             "the checkpoints are the ones named")
    if args.dir is not None:
        args.last = 5 if args.last is None else args.last
        if args.last < 1:
            fail(f"--last must be at least 1, got {args.last}")
        if not os.path.isdir(args.dir):
            fail(f"--dir {args.dir}: no such directory")
        inputs = last_checkpoints(args.dir, args.last, args.by_update)
        if len(inputs) < args.last:
            fail(f"--dir {args.dir}: {len(inputs)} {'interval' if args.by_update else 'epoch'} checkpoint(s), "
                 f"--last asks for {args.last}")
    missing = [path for path in inputs if not os.path.isfile(path)]
    if missing:
        fail(f"--inputs: no such file: {', '.join(missing)}")
    if os.path.exists(args.output) and any(os.path.samefile(args.output, path) for path in inputs):
        fail(f"--output {args.output} is one of the checkpoints to average; give another file")
    if os.path.isdir(args.output):
        fail(f"--output {args.output} is a directory; give the name of the checkpoint file to write")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        fail(f"--output {args.output}: its directory does not exist")
    refuse_existing_output("--output", args.output, args.force, error=fail)  # fail exits itself
    try:
        average_checkpoints(inputs, args.output)
    except Exception as error:  # noqa: BLE001 - a damaged or foreign file: one line naming them
        fail(f"cannot average {', '.join(inputs)}: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
    print(f"averaged {len(inputs)} checkpoints ({', '.join(os.path.basename(p) for p in inputs)}) -> {args.output}")
    return args.output
