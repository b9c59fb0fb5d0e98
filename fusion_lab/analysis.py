"""What the analysis scripts in ``scripts/`` share: the command line, checkpoint loading whose
errors name the flag and the file, tables and heat maps, output checks before any work (nothing is
overwritten without ``--force``) and ``main()`` (an error is one line ``PROG: error: MESSAGE``).
Importing it imports the plugin, which registers its models, so a script needs no ``--user-dir``.
"""

import argparse
import json
import logging
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Callable, List, Optional

import torch

from fusion_fairseq.errors import ConfigurationError
from fusion_lab.common import refuse_existing_output, replace_atomically, write_file

# Figures are a few inches wide: 1200 dots per inch is print quality, and far more exhausts memory.
MAX_DPI = 1200


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures only go to files), with
    matplotlib's logger quietened (fairseq may leave the root logger at DEBUG)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class ReportedError(Exception):
    """An error a script reports as ``PROG: error: MESSAGE``; it exits with ``exit_status``."""

    exit_status = 1


class UsageError(ReportedError):
    """A user error (bad flag value, missing file, unsuitable checkpoint); messages name the flag."""

    exit_status = 2


def checked(flag: str, convert: Callable, valid: Callable, allowed: str):
    """argparse type: ``convert(text)`` where ``valid``, else an error naming the flag, what it allows, the value."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise argparse.ArgumentTypeError(f"{flag} must be {allowed}, got {text!r}")
        return value

    return parse


def positive(kind: type, flag: str):
    return checked(flag, kind, lambda value: value > 0, f"a positive {'integer' if kind is int else 'number'}")


def finite(flag: str):
    """A finite number: nan would be written as invalid JSON, and inf decodes nothing."""
    return checked(flag, float, math.isfinite, "a finite number")


def add_force_argument(parser):
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file (refused otherwise)")


def checkpoint_arguments(parser, data_required=False, out_required=True, paths=1, user_dir=True):
    """Adds the flags every analysis script has: ``--path`` (``paths`` > 1: repeatable), ``--data``, ``--out``
    (a PNG; ``out_required`` None: no figure) with ``--dpi``, ``--json``, ``--user-dir`` and ``--force``."""
    parser.add_argument("--path", required=True, action="append" if paths > 1 else "store",
                        help="checkpoint file (fairseq-train output)" + ("; repeat to compare several" * (paths > 1)))
    parser.add_argument("--data", required=data_required, help="binarised data directory (for the dictionaries)"
                        + ("" if data_required else "; default: the one stored in the checkpoint"))
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    if user_dir:
        parser.add_argument("--user-dir", help="fairseq --user-dir to import (the plugin itself is always imported)")
    if out_required is not None:
        parser.add_argument("--out", required=out_required, help="PNG file to write")
        dpi = checked("--dpi", int, lambda value: 1 <= value <= MAX_DPI, f"an integer from 1 to {MAX_DPI}")
        parser.add_argument("--dpi", type=dpi, default=150,
                            help=f"resolution of the figure in dots per inch, 1 to {MAX_DPI} (default: 150)")
    add_force_argument(parser)
    return parser


def script_parser(doc: str, sentence: bool = False, allow_abbrev: bool = True, source_required: bool = True,
                  **arguments):
    """An analysis script's parser, described by the first paragraph of its docstring ``doc``, with the flags
    of :func:`checkpoint_arguments` (``arguments``); with ``sentence``, also those of the sentence pair of an
    attention plot: ``--source`` (``source_required`` or not), ``--target`` (teacher-forced; default: the
    beam-search translation), ``--bpe``, ``--bpe-codes`` and ``--allow-unk``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=allow_abbrev)
    checkpoint_arguments(parser, **arguments)
    if sentence:
        parser.add_argument("--source", required=source_required, help="source sentence, tokens separated by spaces")
        parser.add_argument("--target", help="target sentence to teacher-force; default: translate --source with "
                            "beam search and plot the hypothesis")
        parser.add_argument("--bpe", choices=("subword_nmt",), help="apply BPE to --source/--target before lookup")
        parser.add_argument("--bpe-codes", help="BPE codes file for --bpe subword_nmt")
        parser.add_argument("--allow-unk", action="store_true",
                            help="map words missing from the dictionary to <unk> (with a warning) instead of failing")
    return parser


def check_outputs(args, outputs, inputs=()) -> None:
    """Before any work: each output ``(flag, path or None)`` goes to an existing directory, differs
    from the other outputs and every input (not even --force replaces an input), and exists only
    with ``args.force``; a :class:`UsageError` naming the flag otherwise."""
    given = [(flag, path) for flag, path in outputs if path]
    for index, (flag, path) in enumerate(given):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UsageError(f"{flag} {path}: the directory {parent} does not exist")
        if os.path.isdir(path):
            raise UsageError(f"{flag} {path} is a directory; give a file name")
        for other_flag, other in list(given[:index]) + [(f, p) for f, p in inputs if p]:
            try:  # the same file, also under two names (a hard link): by device and inode when both exist
                same = os.path.samefile(path, other)
            except OSError:  # one of them does not exist yet
                same = os.path.realpath(path) == os.path.realpath(other)
            if same:
                raise UsageError(f"{flag} {path} is the same file as {other_flag} {other}; give another name")
        refuse_existing_output(flag, path, getattr(args, "force", False), UsageError)


def write_markdown(path: str, text: str) -> None:
    """Write ``text`` to ``path`` and say so on stdout."""
    write_file(path, text)
    print(f"wrote {path}")


def write_json(path: str, result: dict) -> None:
    write_markdown(path, json.dumps(result, indent=1))


def save_figure(figure, file, name: str, dpi: int) -> None:
    """``figure`` into the open ``file``, in the format ``name``'s extension names (as ``savefig(name)`` picks it)."""
    figure.savefig(file, dpi=dpi, format=os.path.splitext(name)[1][1:].lower() or None)


def write_outputs(args, result: dict, figure=None) -> dict:
    """The end of every analysis: ``figure`` (a matplotlib figure, or None) to ``--out``, ``result``
    to ``--json`` when asked for; returns ``result``."""
    if figure is not None:
        replace_atomically(args.out, lambda file: save_figure(figure, file, args.out, args.dpi))
        pyplot().close(figure)
        print(f"wrote {args.out}")
    if args.json:
        write_json(args.json, result)
    return result


def script_main(parse_args: Callable, run: Callable, prog, module_name: str):
    """A script's ``main(argv)``: parse, check the outputs against the inputs, ``run(args)``; 0, or
    the exit status of a :class:`ReportedError` printed as ``PROG: error: MESSAGE``. Run at once,
    exiting with that status, when the script's ``module_name`` is ``__main__``."""
    def main(argv: Optional[List[str]] = None) -> int:
        args = parse_args(argv)
        paths = args.path if isinstance(args.path, list) else [args.path]
        inputs = [("--path", path) for path in paths] + [(flag, getattr(args, flag[2:].replace("-", "_"), None))
                                                         for flag in ("--dict", "--bpe-codes")]
        try:
            check_outputs(args, [("--out", getattr(args, "out", None)), ("--json", args.json)], inputs)
            run(args)
        except ReportedError as error:
            print(f"{prog(args) if callable(prog) else prog}: error: {error}", file=sys.stderr)
            return error.exit_status
        return 0

    if module_name == "__main__":
        sys.exit(main())
    return main


def run_parallel(function: Callable, items: list, jobs: int) -> dict:
    """``{item: function(item)}``, ``jobs`` at a time (threads, each waiting on a subprocess). The first
    failure is re-raised once every started call has finished; none starts after it."""
    with ThreadPoolExecutor(max(1, min(jobs, len(items)))) as pool:
        futures = {item: pool.submit(function, item) for item in items}
        try:
            return {item: future.result() for item, future in futures.items()}
        finally:
            pool.shutdown(cancel_futures=True)


def number(value, spec: str) -> str:
    """``value`` formatted with ``spec``; "n/a" for None and NaN."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def markdown_rows(columns, rows, left: int = 1, pad: bool = False) -> List[str]:
    """Markdown table lines: the first ``left`` columns left-aligned, the others right-aligned (with
    ``pad``, by spaces; otherwise by ``---:``)."""
    cells = [[str(cell).replace("|", "\\|") for cell in row] for row in [columns, *rows]]
    widths = [max(len(row[i]) for row in cells) if pad else 0 for i in range(len(columns))]
    lines = ["| " + " | ".join(cell.ljust(width) if i < left else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths))) + " |" for row in cells]
    rule = ["-" * (width + 2) if pad else "---" + ":" * (i >= left) for i, width in enumerate(widths)]
    return lines[:1] + ["|" + "|".join(rule) + "|"] + lines[1:]


def format_matrix(title: str, matrix, row_labels, column_labels, cell=lambda value: f"{float(value):.3f}",
                  corner: str = "") -> str:
    """``title``, the column labels and one line per row of ``matrix``: its label, then ``cell(value)``
    right-aligned."""
    rows = [[label] + [cell(value) for value in values] for label, values in zip(row_labels, matrix)]
    widths = [max(len(text) for text in column) for column in zip([corner] + list(column_labels), *rows)]
    return "\n".join([title] + ["  ".join(text.ljust(width) if j == 0 else text.rjust(width)
                                           for j, (text, width) in enumerate(zip(line, widths)))
                                 for line in [[corner] + list(column_labels)] + rows])


def heatmap(ax, matrix, x_labels=None, y_labels=None, cmap="Blues", vmin=0.0, vmax=1.0, origin="upper",
            annotate=None, colorbar=None, rotate_x=False, xlabel="", ylabel="", title=""):
    """``matrix`` drawn on ``ax`` with NaN cells blank, the tick labels, axis labels and title given;
    ``annotate(value)`` writes each cell's value (white on the darker cells); ``colorbar`` labels a
    colour bar. Returns the image."""
    import numpy as np

    if vmax - vmin < 1e-6:  # one value everywhere (say, uniform weights): a colour scale around it
        vmin, vmax = vmin - 0.01, vmax + 0.01
    matrix = np.asarray(matrix, dtype=float)
    cmap = pyplot().get_cmap(cmap).with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=vmin, vmax=vmax, origin=origin, aspect="auto",
                      interpolation="nearest")
    for (row, column), value in np.ndenumerate(matrix if annotate else np.empty((0, 0))):
        if not np.isnan(value):
            ax.text(column, row, annotate(value), ha="center", va="center", fontsize=8,
                    color="white" if (value - vmin) / (vmax - vmin) > 0.6 else "black")
    rotation = {"rotation": 60, "ha": "right", "rotation_mode": "anchor"} if rotate_x else {}
    if x_labels is not None:
        ax.set_xticks(range(matrix.shape[1]), x_labels, fontsize=8, **rotation)
    if y_labels is not None:
        ax.set_yticks(range(matrix.shape[0]), y_labels, fontsize=8)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.03).set_label(colorbar, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    return image


def read_checkpoint(path: str, overrides: Optional[dict] = None):
    """The state of checkpoint ``path`` (``overrides`` applied to its configuration). A file
    that is missing, damaged, not a torch file or not a fairseq checkpoint of a registered task and
    architecture is a one-line :class:`UsageError` naming ``--path`` and the file."""
    from fairseq import checkpoint_utils
    from fairseq.tasks import TASK_REGISTRY

    import fusion_fairseq.models  # noqa: F401  (registers the plugin; its reader reads checkpoints safely)
    from fusion_fairseq.checkpoint_safety import CheckpointContentError, stored_value

    if not os.path.isfile(path):
        raise UsageError(f"--path {path}: no such checkpoint file")
    try:  # the plugin's reader refuses a file without a model or of an architecture fairseq does not know
        state = checkpoint_utils.load_checkpoint_to_cpu(path, overrides)
    except CheckpointContentError as error:  # it names the file
        raise UsageError(f"--path {error}") from None
    except Exception as error:  # noqa: BLE001 - any unreadable file: truncated, not a zip, refused pickle ...
        reason = " ".join(str(error).split())[:300]
        raise UsageError(f"--path {path}: cannot read the checkpoint, the file is damaged or not a fairseq "
                         f"checkpoint ({type(error).__name__}: {reason})") from None
    # an unknown task (a plugin not imported, a crafted name) fails deep inside fairseq
    task = stored_value(stored_value(state.get("cfg"), "task"), "_name")  # fairseq's reader made legacy args a cfg
    if not isinstance(task, str) or task not in TASK_REGISTRY:
        raise UsageError(f"--path {path}: the checkpoint's task {task!r} is not one fairseq knows; pass the "
                         "--user-dir that registers it, or give a checkpoint of a registered one")
    return state


def checkpoint_setting(model_config, option: str, allowed, flag: str, lacking: str, side=None) -> str:
    """The checkpoint's ``--OPTION`` (``--OPTION-SIDE`` with ``side``), one of ``allowed``; otherwise an error
    naming ``flag``, what the checkpoint has, so ``lacking``, what is needed and, where the other side
    has it, ``try --side OTHER``."""
    def value(name):
        return getattr(model_config, name.replace("-", "_"), None)

    hint = ""
    if side is not None:
        other = "decoder" if side == "encoder" else "encoder"
        if value(f"{option}-{other}") in allowed:
            hint = f"; its {other} has --{option}-{other} {value(f'{option}-{other}')}, try --side {other}"
        option = f"{option}-{side}"
    found = value(option)
    if found not in allowed:
        having = f"no --{option}" if found is None else f"--{option} {found}"
        arch = getattr(model_config, "arch", None) or getattr(model_config, "_name", "?")
        raise UsageError(f"{flag}: the checkpoint (arch {arch}) has {having}, so "
                         f"{lacking}; a fusion_transformer checkpoint trained with --{option} {' or '.join(allowed)} "
                         f"is needed{hint}")
    return found


def load_model(path: str, data: Optional[str], user_dir: Optional[str] = None, overrides: Optional[dict] = None):
    """``(model in eval mode, cfg, task)`` of ``--path`` with ``overrides`` and ``--data`` (None: the
    one stored in the checkpoint, which must exist)."""
    from fairseq import checkpoint_utils, utils

    if user_dir:
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))
    state = read_checkpoint(path, {**(overrides or {}), **({"data": data} if data is not None else {})})
    if data is not None and not os.path.isdir(data):
        raise UsageError(f"--data {data}: no such directory")
    stored = state["cfg"]["task"].get("data")  # read_checkpoint made legacy args a cfg with a task
    if data is None and (not stored or not os.path.isdir(str(stored).split(os.pathsep)[0])):
        raise UsageError(f"--data: the data directory stored in {path} ({stored}) does not exist; pass --data "
                         "DATA_BIN (the binarised data the model was trained on, for its dictionaries)")
    state["last_optimizer_state"] = None  # not needed; frees memory before the model is built
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], state=state)
    except OSError as error:  # a data directory without the dictionaries
        raise UsageError(f"--data {data or stored}: cannot set up the task ({type(error).__name__}: {error}); pass "
                         "--data DATA_BIN, the binarised data the model was trained on") from None
    except ConfigurationError as error:  # an override the model refuses, in the words of its own flag
        raise UsageError(str(error)) from None
    models[0].eval()
    return models[0], cfg, task


def encode_sentence(args, flag: str, dictionary, bpe, max_tokens: int) -> torch.Tensor:
    """Token ids of the sentence of ``flag`` (``--source`` or ``--target``) followed by EOS, as fairseq binarises
    sentences; an unknown word (without ``--allow-unk``) or more than ``max_tokens`` is a :class:`UsageError`."""
    text = getattr(args, flag[2:])
    words = (text if bpe is None else bpe.encode(text)).split()
    if not words:
        raise UsageError(f"{flag} is empty")
    ids = [dictionary.index(word) for word in words] + [dictionary.eos()]
    for word in (word for word, index in zip(words, ids) if index == dictionary.unk()):
        message = f"{flag}: word {word!r}{' after BPE' * (bpe is not None)} is not in the dictionary " \
                  f"({len(dictionary)} types)"
        if not args.allow_unk:
            raise UsageError(message + "; pass --allow-unk to map it to <unk>")
        print(f"warning: {message}; mapped to {dictionary.unk_word}", file=sys.stderr)
    if len(ids) > max_tokens:
        raise UsageError(f"{flag} has {len(ids)} tokens (end of sentence included), but the model reads at most "
                         f"{max_tokens} positions; give a shorter sentence")
    return torch.tensor(ids, dtype=torch.long)


def sentence_pair(args, model, task, with_target: bool = True, **generation) -> SimpleNamespace:
    """The sentences of an attention plot as the model reads them (after ``--bpe``): ``src_tokens``, ``src_lengths``
    (a batch of 1) and the ``source`` strings; ``with_target``, also the target's strings ending with EOS
    (``predicted``), those fed to the decoder (``fed``, EOS first) as ``prev_output_tokens``, and ``target_from``:
    ``--target``, else the best beam-search hypothesis (``generation``: fields of fairseq's ``GenerationConfig``)."""
    from fairseq.data import encoders
    from fairseq.dataclass.configs import GenerationConfig

    if bool(args.bpe) != bool(args.bpe_codes):
        raise UsageError("--bpe subword_nmt needs --bpe-codes FILE" if args.bpe else
                         "--bpe-codes needs --bpe subword_nmt")
    if args.bpe and not os.path.isfile(args.bpe_codes):
        raise UsageError(f"--bpe-codes {args.bpe_codes}: no such file")
    bpe = encoders.build_bpe(argparse.Namespace(bpe=args.bpe, bpe_codes=args.bpe_codes)) if args.bpe else None
    src_tokens = encode_sentence(args, "--source", task.source_dictionary, bpe, model.encoder.max_positions())
    pair = SimpleNamespace(src_tokens=src_tokens.unsqueeze(0), src_lengths=torch.tensor([src_tokens.numel()]),
                           source=[task.source_dictionary[int(i)] for i in src_tokens])
    if not with_target:
        return pair
    if args.target is not None:
        tgt_tokens = encode_sentence(args, "--target", task.target_dictionary, bpe, model.decoder.max_positions())
        pair.target_from = "--target"
    else:
        generator = task.build_generator([model], GenerationConfig(**generation))
        sample = {"net_input": {"src_tokens": pair.src_tokens, "src_lengths": pair.src_lengths}}
        with torch.no_grad():
            tgt_tokens = task.inference_step(generator, [model], sample)[0][0]["tokens"].cpu()
        pair.target_from = "beam search (" + ", ".join(f"{key} {value}" for key, value in generation.items()
                                                       if key in ("beam", "lenpen")) + ")"
    eos = task.target_dictionary.eos()
    pair.prev_output_tokens = torch.cat([tgt_tokens.new_tensor([eos]), tgt_tokens[:-1]]).unsqueeze(0)
    pair.predicted = [task.target_dictionary[int(i)] for i in tgt_tokens]
    pair.fed = [task.target_dictionary[eos]] + pair.predicted[:-1]
    return pair
