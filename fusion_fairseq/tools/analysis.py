"""Shared pieces of the analysis scripts in ``scripts/`` (``plot_fusion_attention.py``,
``plot_layer_attention.py``, ``plot_mixed_attention.py``, ``mask_encoder_layers.py``,
``embedding_analysis.py``, ``aggregation_exploitation.py``).

What lives here is only what those scripts have in common; each script keeps its own analysis:

* :func:`use_agg_backend`: matplotlib's non-interactive backend; call it before ``pyplot`` is imported.
* :class:`ReportedError` / :class:`UsageError` and :func:`run_main`: a script's ``main()``, which
  reports an error as ``PROG: error: MESSAGE`` on stderr with the error's exit status (2 for a
  user error).
* Checkpoint loading with fairseq's ``checkpoint_utils``: :func:`load_model` (``--data`` given),
  :func:`load_checkpoint_state` + :func:`model_from_state` (``--data`` optional), and the checks
  and their messages, which name the flag (:func:`check_checkpoint_file`, :func:`check_data_dir`);
  :func:`read_checkpoint` reports a damaged or non-checkpoint file in one line naming it.
* Output files: :func:`add_force_argument` and :func:`check_outputs`, called before any work, so
  that no script overwrites an existing file without ``--force`` (the rule of
  :func:`fusion_fairseq.tools.common.refuse_existing_output`), nor fails only after its work;
  :func:`write_json` and :func:`write_markdown` write and say so.
* Sentences to token ids: :func:`build_bpe`, :func:`encode_sentence` (unknown words are an error
  unless ``--allow-unk``), :func:`token_strings`, :func:`beam_search`, :func:`teacher_forced_input`.
* Small argparse helpers for the flags several scripts share (:func:`positive` for --beam,
  --timeout ...).

Importing this module imports the plugin (``fusion_fairseq``), which registers its models, so a
script needs no ``--user-dir``.
"""

import argparse
import json
import logging
import math
import os
import sys
from typing import Callable, List, Optional

import torch

from fusion_fairseq.tools.common import refuse_existing_output

USER_DIR_HELP = "fairseq --user-dir to import (the plugin itself is always imported)"


def use_agg_backend():
    """Select matplotlib's non-interactive Agg backend (figures are only written to files) and
    quieten matplotlib's logger, which fairseq may leave at DEBUG through the root logger. Call it
    before ``matplotlib.pyplot`` is imported."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")


# --------------------------------------------------------------------------------------------
# errors and main()


class ReportedError(Exception):
    """An error a script reports as ``PROG: error: MESSAGE``; it exits with ``exit_status``."""

    exit_status = 1


class UsageError(ReportedError):
    """A user error (bad flag value, missing file, unsuitable checkpoint): reported as
    ``error: MESSAGE`` with exit status 2. Messages name the flag."""

    exit_status = 2


def run_main(run: Callable, args, prog: str) -> int:
    """A script's ``main()``: ``run(args)``; 0 on success, or a :class:`ReportedError` printed as
    ``PROG: error: MESSAGE`` on stderr and its exit status (2 for a :class:`UsageError`)."""
    try:
        run(args)
    except ReportedError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return error.exit_status
    return 0


# --------------------------------------------------------------------------------------------
# argparse helpers and output


def add_user_dir_argument(parser):
    """``--user-dir``: an extra fairseq user directory (the plugin itself is always imported)."""
    parser.add_argument("--user-dir", help=USER_DIR_HELP)


def add_text_input_arguments(parser):
    """``--bpe``, ``--bpe-codes`` and ``--allow-unk`` for the sentences given on the command line
    (see :func:`build_bpe`, :func:`encode_sentence`); check them with :func:`check_bpe_arguments`."""
    parser.add_argument("--bpe", choices=("subword_nmt",), help="apply BPE to --source/--target before lookup")
    parser.add_argument("--bpe-codes", help="BPE codes file for --bpe subword_nmt")
    parser.add_argument("--allow-unk", action="store_true",
                        help="map words missing from the dictionary to <unk> (with a warning) instead of failing")


def check_bpe_arguments(parser, args):
    """``--bpe`` and ``--bpe-codes`` go together (a usage error of ``parser`` otherwise)."""
    if args.bpe and not args.bpe_codes:
        parser.error("--bpe subword_nmt needs --bpe-codes FILE")
    if args.bpe_codes and not args.bpe:
        parser.error("--bpe-codes needs --bpe subword_nmt")


def positive(kind: type, flag: str):
    """argparse type: a positive ``kind`` (int or float); the error names the flag and the value."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive {'integer' if kind is int else 'number'}, "
                                             f"got {text!r}")
        return value

    return parse


def integer_in(flag: str, low: int, high: int):
    """argparse type: an integer from ``low`` to ``high``; the error names the flag, the value and the range."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer from {low} to {high}, got {text!r}")
        return value

    return parse


# Figures are a few inches wide: 1200 dots per inch is print quality, and far more exhausts memory.
MAX_DPI = 1200


def add_dpi_argument(parser, default: int = 150):
    parser.add_argument("--dpi", type=integer_in("--dpi", 1, MAX_DPI), default=default,
                        help=f"resolution of the figure in dots per inch, 1 to {MAX_DPI} (default: {default})")


def finite(flag: str):
    """argparse type: a finite number (nan would be written as invalid JSON, and inf decodes nothing)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number, got {text!r}")
        return value

    return parse


def add_force_argument(parser):
    """``--force``: the only way a script overwrites an existing output file (see :func:`check_outputs`)."""
    parser.add_argument("--force", action="store_true",
                        help="overwrite an existing output file, which is refused otherwise")


def same_file(a: str, b: str) -> bool:
    """The same file, also under two names (a hard link): compared by device and inode when both exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(args, outputs, inputs=()) -> None:
    """Called before any work: each output (``(flag, path)``, path None when not asked for) must
    go to an existing directory, be no directory itself, differ from the other outputs and from
    every input (``(flag, path)``; not even --force replaces an input), and exist only with
    ``args.force`` (:func:`refuse_existing_output`). A :class:`UsageError` naming the flag otherwise."""
    given = [(flag, path) for flag, path in outputs if path]
    for index, (flag, path) in enumerate(given):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UsageError(f"{flag} {path}: the directory {parent} does not exist")
        if os.path.isdir(path):
            raise UsageError(f"{flag} {path} is a directory; give a file name")
        for other_flag, other in list(given[:index]) + [(f, p) for f, p in inputs if p]:
            if same_file(path, other):
                raise UsageError(f"{flag} {path} is the same file as {other_flag} {other}; give another name")
        refuse_existing_output(flag, path, getattr(args, "force", False), UsageError)


def write_json(path: str, result: dict) -> None:
    """Write ``result`` to ``path`` as indented JSON (``--json OUT``) and say so on stdout."""
    with open(path, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {path}")


def write_markdown(path: str, text: str) -> None:
    """Write the Markdown ``text`` to ``path`` and say so on stdout."""
    with open(path, "w") as handle:
        handle.write(text)
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------------
# checkpoint loading


def import_user_dir(user_dir: Optional[str]) -> None:
    """Import ``--user-dir`` as fairseq does, when given."""
    if user_dir:
        from fairseq import utils

        utils.import_user_module(argparse.Namespace(user_dir=user_dir))


def check_checkpoint_file(path: str) -> None:
    """``--path``: a :class:`UsageError` unless the checkpoint file exists."""
    if not os.path.isfile(path):
        raise UsageError(f"--path {path}: no such checkpoint file")


def read_checkpoint(path: str, overrides: Optional[dict] = None, flag: str = "--path"):
    """The state of checkpoint ``path`` (``overrides`` applied to its configuration). A file
    that is missing, damaged (truncated, empty, random bytes), not a torch file (text) or not a
    fairseq checkpoint is a one-line :class:`UsageError` naming the flag and the file."""
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: no such checkpoint file")
    from fusion_fairseq.checkpoint_safety import CheckpointContentError

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path, overrides)
    except CheckpointContentError as error:  # it names the file
        raise UsageError(f"{flag} {error}") from None
    except Exception as error:  # noqa: BLE001 - any unreadable file: truncated, not a zip, refused pickle ...
        reason = " ".join(str(error).split())[:300]
        raise UsageError(f"{flag} {path}: cannot read the checkpoint, the file is damaged or not a fairseq "
                         f"checkpoint ({type(error).__name__}: {reason})") from None
    if not isinstance(state, dict) or "model" not in state or model_args(state) is None:
        raise UsageError(f"{flag} {path}: cannot read the checkpoint, a torch file without a fairseq model "
                         "and configuration")
    check_registered(state, path, flag)
    return state


def check_registered(state, path: str, flag: str = "--path") -> None:
    """A :class:`UsageError` naming the file unless fairseq knows the checkpoint's task and
    architecture (a plugin not imported, or a crafted name, fails deep inside fairseq otherwise)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    from fusion_fairseq.checkpoint_safety import architecture, stored_value

    cfg = state.get("cfg")
    task = stored_value(stored_value(cfg, "task"), "_name") if cfg is not None else getattr(state["args"], "task", None)
    arch = architecture(model_args(state))
    for kind, name, known in (("task", task, TASK_REGISTRY), ("architecture", arch, {**MODEL_REGISTRY,
                                                                                      **ARCH_MODEL_REGISTRY})):
        if not isinstance(name, str) or name not in known:
            raise UsageError(f"{flag} {path}: the checkpoint's {kind} {name!r} is not one fairseq knows; pass the "
                             "--user-dir that registers it, or give a checkpoint of a registered one")


def check_data_dir(data: str) -> None:
    """``--data``: a :class:`UsageError` unless the data directory exists."""
    if not os.path.isdir(data):
        raise UsageError(f"--data {data}: no such directory")


def load_model(path: str, data: str, user_dir: Optional[str] = None):
    """``(model, cfg, task)`` of checkpoint ``path`` with the task's data directory ``data``
    (``--data``, required), the model in eval mode."""
    import_user_dir(user_dir)
    check_checkpoint_file(path)
    check_data_dir(data)
    return model_from_state(path, read_checkpoint(path, {"data": data}))


def model_args(state):
    """The model's argparse namespace / config of a checkpoint state (new ``cfg`` or legacy ``args``)."""
    if state.get("cfg") is not None and state["cfg"].get("model") is not None:
        return state["cfg"]["model"]
    return state.get("args")


def load_checkpoint_state(path: str, data: Optional[str], overrides: Optional[dict] = None,
                          user_dir: Optional[str] = None, checkpoint_name: str = "the checkpoint"):
    """The checkpoint state of ``path`` read with ``overrides`` (and ``data``, the optional
    ``--data``) applied. Without ``data`` the directory stored in the checkpoint must exist; the
    error then calls the checkpoint ``checkpoint_name``. Errors name the flag."""
    import_user_dir(user_dir)
    check_checkpoint_file(path)
    overrides = dict(overrides or {})
    if data is not None:
        check_data_dir(data)
        overrides["data"] = data
    state = read_checkpoint(path, overrides)
    if data is None:
        cfg = state.get("cfg")
        stored = cfg["task"].get("data") if cfg is not None and cfg.get("task") is not None else \
            getattr(state.get("args"), "data", None)
        if not stored or not os.path.isdir(str(stored).split(os.pathsep)[0]):
            raise UsageError(
                f"--data: the data directory stored in {checkpoint_name} ({stored}) does not exist; "
                "pass --data DATA_BIN (the binarised data the model was trained on, for its dictionaries)"
            )
    return state


def model_from_state(path: str, state):
    """``(model, cfg, task)`` built from a checkpoint state read from ``path``, the model in eval mode."""
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], state=state)
    model = models[0]
    model.eval()
    return model, cfg, task


# --------------------------------------------------------------------------------------------
# text -> tokens


def build_bpe(args):
    """fairseq's BPE encoder of ``--bpe``/``--bpe-codes`` (None without ``--bpe``)."""
    if not args.bpe:
        return None
    from fairseq.data import encoders

    if not os.path.isfile(args.bpe_codes):
        raise UsageError(f"--bpe-codes {args.bpe_codes}: no such file")
    return encoders.build_bpe(argparse.Namespace(bpe=args.bpe, bpe_codes=args.bpe_codes))


def encode_sentence(text: str, dictionary, flag: str, bpe=None, allow_unk: bool = False,
                    max_tokens: Optional[int] = None) -> torch.Tensor:
    """Token ids of ``text`` followed by EOS (as fairseq binarises sentences).

    ``text`` (the value of ``flag``) is split on whitespace after ``bpe``. A word that is not in
    ``dictionary`` is a :class:`UsageError` naming the flag and the word, or with ``allow_unk``
    a warning on stderr and <unk>. So is a sentence of more than ``max_tokens`` tokens (the
    positions the model reads), which would fail inside the model or make a huge figure."""
    if bpe is not None:
        text = bpe.encode(text)
    words = text.split()
    if not words:
        raise UsageError(f"{flag} is empty")
    ids = []
    for word in words:
        index = dictionary.index(word)
        if index == dictionary.unk():
            after_bpe = " after BPE" if bpe is not None else ""
            message = f"{flag}: word {word!r}{after_bpe} is not in the dictionary ({len(dictionary)} types)"
            if not allow_unk:
                raise UsageError(message + "; pass --allow-unk to map it to <unk>")
            print(f"warning: {message}; mapped to {dictionary.unk_word}", file=sys.stderr)
        ids.append(index)
    ids.append(dictionary.eos())
    if max_tokens is not None and len(ids) > max_tokens:
        raise UsageError(f"{flag} has {len(ids)} tokens (end of sentence included), but the model reads at most "
                         f"{max_tokens} positions; give a shorter sentence")
    return torch.tensor(ids, dtype=torch.long)


def token_strings(dictionary, ids: torch.Tensor) -> List[str]:
    """The dictionary's symbols of token ids."""
    return [dictionary[int(i)] for i in ids]


def beam_search(model, task, src_tokens: torch.Tensor, **generation) -> torch.Tensor:
    """Best beam-search hypothesis of one source sentence (token ids ending with EOS);
    ``generation`` are fields of fairseq's ``GenerationConfig`` (``beam``, ``lenpen``, ...)."""
    from fairseq.dataclass.configs import GenerationConfig

    generator = task.build_generator([model], GenerationConfig(**generation))
    sample = {"net_input": {"src_tokens": src_tokens.unsqueeze(0),
                            "src_lengths": torch.tensor([src_tokens.numel()])}}
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
    return hypos[0][0]["tokens"].cpu()


def teacher_forced_input(model, tgt_tokens: torch.Tensor) -> torch.Tensor:
    """fairseq's ``prev_output_tokens`` (batch of 1) for a target ending with EOS: ``[EOS] + tgt_tokens[:-1]``."""
    eos = model.decoder.dictionary.eos()
    return torch.cat([tgt_tokens.new_tensor([eos]), tgt_tokens[:-1]]).unsqueeze(0)
