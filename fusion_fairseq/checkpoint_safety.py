"""Let torch's safe unpickler read fairseq checkpoints without turning safe loading off.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses every global that
is not allow-listed. fairseq checkpoints store their configuration as an ``argparse.Namespace``
(legacy ``args`` / ``cfg.model``) or, in older files, as omegaconf containers; so
``fairseq-generate`` cannot load any checkpoint. On import, the plugin allow-lists exactly the
types found in such files (listed by ``torch.serialization.get_unsafe_globals_in_checkpoint`` on
checkpoints written by fairseq-train and on omegaconf-configured ones). Any other global, e.g. a
callable smuggled in a crafted pickle, is still refused.
"""

import argparse
import collections
import typing

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

# Types (not callables with side effects): configuration containers and the plain type objects
# that omegaconf metadata refers to as ``ref_type`` / ``object_type`` / ``element_type``.
FAIRSEQ_CHECKPOINT_TYPES = (
    argparse.Namespace,
    collections.defaultdict,
    typing.Any,
    dict,
    list,
    int,
    float,
    bool,
    str,
    DictConfig,
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    BooleanNode,
    FloatNode,
    IntegerNode,
    StringNode,
)


def allow_fairseq_checkpoint_types():
    """Add :data:`FAIRSEQ_CHECKPOINT_TYPES` to torch's safe globals (idempotent)."""
    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_TYPES))
