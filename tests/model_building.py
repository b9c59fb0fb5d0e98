"""Build plugin models from command-line style flags without data on disk."""

from types import SimpleNamespace

from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY

import fusion_fairseq.models  # noqa: F401  (registers the plugin)
from fusion_lab.common import count_parameters, dictionary_of_size  # noqa: F401  (the tests' imports)


def parse_model_args(arch, *flags):
    """Parse flags exactly as ``fairseq-train`` does (architecture defaults included)."""
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["unused-data-dir", "--arch", arch, *flags])


def task_of(src_vocab=100, tgt_vocab=80, joined=False):
    """What a model's ``build_model`` reads of a translation task: its two dictionaries."""
    src_dict = dictionary_of_size(src_vocab)
    return SimpleNamespace(source_dictionary=src_dict, target_dictionary=src_dict if joined else dictionary_of_size(tgt_vocab))


def build_model(arch, *flags, src_vocab=100, tgt_vocab=80, joined=False):
    args = parse_model_args(arch, *flags)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task_of(src_vocab, tgt_vocab, joined))
