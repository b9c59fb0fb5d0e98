"""Golden outputs: the fixed-seed loss and gradient norm of every configuration the project must keep
computing the same function for, on one fixed batch, stored as numbers in ``golden_outputs.json``.

Three sets of configurations:

* every configuration of the comparisons (``fusion_lab/comparison.py``): the shallow one
  (``comparison/``, 3+3) and the deep one (``deep/``, 6+6), each at its width with the matched
  sizes it trains, and every composition of its ``fusion_transformer`` components that builds, so
  that the code on main provably computes what the pinned checkout of a comparison computes;
* every registered architecture and preset, and the options no comparison or preset trains
  (DenseFormer's k x p, static and manifold-constrained hyper-connections), at the conformance
  suite's tiny width.

``python tests/golden_outputs.py --write`` stores the numbers of the code as it is;
``python tests/golden_outputs.py --compare`` prints every difference, bit for bit;
``python tests/golden_outputs.py --update KEY ...`` stores the numbers of the named configurations only.
"""

import argparse
import itertools
import json
import math
import os
import sys
import tempfile
from typing import Dict, List, Sequence, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from conformance_utils import ARCHITECTURES, build_like_fairseq_train, flags_of, Variant  # noqa: E402
from conftest import preprocess, write_reversal_corpus  # noqa: E402
from fusion_lab import comparison  # noqa: E402

GOLDEN_PATH = os.path.join(HERE, "golden_outputs.json")
#: the sizes the comparisons matched on Multi30k (7,872 joined types): the shallow one's plan.json
#: (--small), and the deep one's (--deep: 14 shared layers, as He et al.'s Table 3, growth 96)
SHALLOW_MATCHED = {"layerwise_coordination": 7, "dense_transformer": 104}
DEEP_MATCHED = {"layerwise_coordination": 14, "dense_transformer": 96}
#: the reviewed round's (--reviewed) at the 6+6 width: the deep one's, and the Transformer whose FFN widths
#: match deep representations' 5,231,872 parameters (981: 5,231,100)
REVIEWED_MATCHED = {**DEEP_MATCHED, "transformer_wide": 981}
#: the rows of the finished 3+3 and 6+6 comparisons, which trained at their pins (examples/comparison/
#: converged.sh, deep.sh); the 6+6 rows fine-tuned from the Transformer's final model compute their base
#: rows' functions, and each composition the features of its components together
SHALLOW_METHODS = ("transformer", "mlrf", "deeprep", "surface_fusion", "fgla", "layerwise_coordination",
                   "dense_transformer")
FINE_TUNED = {"transformer_continued": "transformer", "deeprep_finetuned": "deeprep"}
DEEP_METHODS = (*SHALLOW_METHODS, "denseformer", "hyper_connections", *FINE_TUNED)
#: the composition components: the shallow comparison's (its pinned code's; SurfaceFusion was one then), the deep one's
SHALLOW_COMPONENTS = ("mlrf", "deeprep", "surface_fusion", "fgla")
DEEP_COMPONENTS = ("mlrf", "deeprep", "fgla")
BATCH_SENTENCES = 8
SEED = 7


def compared_configurations(prefix: str, names, components, width: str, matched: Dict[str, int]):
    """{id: (arch, model flags, criterion flags)} of one comparison's rows and the compositions of its components."""
    width = comparison.parse_width(width)
    methods = {name: comparison.METHODS[FINE_TUNED.get(name, name)] for name in names}
    for size in range(2, len(components) + 1):
        for parts in itertools.combinations(components, size):
            features = [comparison.METHODS[name] for name in parts]
            methods["composition:" + "+".join(parts)] = comparison.Method(
                "composition", "", "", "fusion_transformer", tuple(flag for part in features for flag in part.flags),
                criterion=next((part.criterion for part in features if part.criterion), ()))
    return {
        f"{prefix}/{name}": (method.arch, comparison.model_flags(method, width, matched.get(name))[2:],
                             list(method.criterion or comparison.DEFAULT_CRITERION))
        for name, method in methods.items()
    }


def comparison_configurations() -> Dict[str, Tuple[str, List[str], List[str]]]:
    """The shallow comparison's (``comparison/``, 3+3), the deep one's (``deep/``, 6+6) and the reviewed
    round's (``reviewed/``, 6+6, each configuration's function whatever its learning rate)."""
    return {
        **compared_configurations("comparison", SHALLOW_METHODS, SHALLOW_COMPONENTS,
                                  comparison.SMALL_WIDTH, SHALLOW_MATCHED),
        **compared_configurations("deep", DEEP_METHODS, DEEP_COMPONENTS, comparison.DEEP_WIDTH,
                                  DEEP_MATCHED),
        **compared_configurations("reviewed", comparison.REVIEWED_METHODS, (), comparison.DEEP_WIDTH,
                                  REVIEWED_MATCHED),
    }


def architecture_configurations() -> Dict[str, Tuple[str, List[str], List[str]]]:
    return {f"architecture/{arch}": (arch, flags_of(Variant(arch, arch)), list(comparison.DEFAULT_CRITERION))
            for arch in ARCHITECTURES}


#: options of ``fusion_transformer`` that no comparison row or preset trains, at the conformance suite's tiny width
OPTIONS = {
    "denseformer-2x2+pre-norm": ("--denseformer-encoder", "--denseformer-decoder", "--denseformer-dilation", "2",
                                 "--denseformer-period", "2", "--encoder-layers", "4", "--decoder-layers", "4",
                                 "--encoder-normalize-before", "--decoder-normalize-before"),
    "hyper-connections=static": ("--hyper-connections-encoder", "static", "--hyper-connections-decoder", "static"),
    "hyper-connections=manifold+pre-norm": ("--hyper-connections-encoder", "manifold", "--hyper-connections-decoder",
                                            "manifold", "--encoder-normalize-before", "--decoder-normalize-before"),
    "mudd+released": ("--mudd-encoder", "--mudd-decoder", "--mudd-variant", "released"),
}


def option_configurations() -> Dict[str, Tuple[str, List[str], List[str]]]:
    arch = "fusion_transformer"
    return {f"option/{name}": (arch, [*flags_of(Variant(arch, arch)), *flags], list(comparison.DEFAULT_CRITERION))
            for name, flags in OPTIONS.items()}


def configurations() -> Dict[str, Tuple[str, List[str], List[str]]]:
    return {**comparison_configurations(), **architecture_configurations(), **option_configurations()}


def make_data_bin(directory: str) -> str:
    """The conformance suite's tiny corpus (a fixed seed) with one joined dictionary."""
    write_reversal_corpus(os.path.join(directory, "raw"))
    return preprocess(os.path.join(directory, "raw"), os.path.join(directory, "bin"), joined=True)


def golden_output(data_bin: str, arch: str, flags: Sequence[str], criterion: Sequence[str]) -> Dict[str, float]:
    """Loss, NLL and gradient norm of the first sentences of the training set, in training mode
    (dropout on) with fixed seeds, through fairseq's task and criterion as fairseq-train builds them."""
    built = build_like_fairseq_train(data_bin, arch, [*flags, *criterion], seed=1)
    criterion_module = built.task.build_criterion(built.args)
    built.task.load_dataset("train")
    dataset = built.task.dataset("train")
    sample = dataset.collater([dataset[i] for i in range(BATCH_SENTENCES)])
    model = built.model.train()
    torch.manual_seed(SEED)
    loss, _, logging_output = criterion_module(model, sample)
    loss.backward()
    squares = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    return {"loss": loss.item(), "nll_loss": float(logging_output["nll_loss"]), "grad_norm": math.sqrt(squares)}


def compute(data_bin: str, ids: Sequence[str] = ()) -> Dict[str, Dict[str, float]]:
    wanted = configurations()
    return {key: golden_or_refusal(data_bin, key, *wanted[key]) for key in (ids or wanted)}


def golden_or_refusal(data_bin: str, key: str, arch: str, flags: Sequence[str], criterion: Sequence[str]):
    """A composition whose components define the same thing twice is refused when built: its golden
    output is that refusal."""
    try:
        return golden_output(data_bin, arch, flags, criterion)
    except (ValueError, SystemExit):
        if "/composition:" not in key:
            raise
        return {"refused": 1.0}


def read_golden() -> Dict[str, Dict[str, float]]:
    with open(GOLDEN_PATH, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help=f"store the current numbers in {GOLDEN_PATH}")
    action.add_argument("--compare", action="store_true", help="print every number that differs from the stored one")
    action.add_argument("--update", nargs="+", metavar="KEY",
                        help="store the current numbers of these configurations only (the ones changed on purpose)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.update:
        unknown = sorted(set(args.update) - set(configurations()))
        if unknown:
            parser.error(f"--update: no configuration {', '.join(unknown)}")
        with tempfile.TemporaryDirectory() as directory:
            outputs = {**read_golden(), **compute(make_data_bin(directory), args.update)}
    else:
        with tempfile.TemporaryDirectory() as directory:
            outputs = compute(make_data_bin(directory))
    if args.write or args.update:
        with open(GOLDEN_PATH, "w", encoding="utf-8") as f:
            json.dump(outputs, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {len(outputs)} configurations to {GOLDEN_PATH}")
        return 0
    stored = read_golden()
    differences = [f"{key} {name}: stored {stored.get(key, {}).get(name)!r}, now {value!r}"
                   for key, values in outputs.items() for name, value in values.items()
                   if stored.get(key, {}).get(name) != value]
    missing = sorted(set(stored) - set(outputs))
    print("\n".join(differences + [f"{key}: stored, no longer computed" for key in missing]) or
          f"all {len(outputs)} configurations identical, bit for bit")
    return 1 if differences or missing else 0


if __name__ == "__main__":
    sys.exit(main())
