"""Activation checkpointing (``--checkpoint-activations`` / ``--offload-activations``) for layers
that fairseq's own ``checkpoint_wrapper`` cannot serve.

fairseq's wrapper is a re-entrant autograd function: the layer runs under ``no_grad`` and is
re-run in backward from its positional inputs alone. A layer that reads a tensor handed over
beside its inputs (the lower layers' states of multi-layer attention), or that leaves one
behind for its caller (DenseNMT's decoder layers record their source attention, Eq. 7), would
then either find nothing in backward or pass no gradient through it. torch's non-re-entrant
checkpoint keeps the forward's autograd graph and only drops (and recomputes) the tensors saved
for backward inside the region, so such tensors keep their gradients.
"""

import contextlib
import functools
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint


def call_checkpointed(function: Callable, *args, enabled: bool, offload: bool = False, **kwargs):
    """``function(*args, **kwargs)``; with ``enabled`` (and gradients on), its activations are
    recomputed in backward instead of kept. ``offload``: what is still kept for backward around
    the region goes to CPU memory (``--offload-activations``)."""
    if not (enabled and torch.is_grad_enabled()):
        return function(*args, **kwargs)
    keep = torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()) if offload else contextlib.nullcontext()
    with keep:
        return checkpoint(function, *args, use_reentrant=False, **kwargs)


def layer_checkpointing(args) -> Callable:
    """``--checkpoint-activations`` / ``--offload-activations`` of a stack whose layers are not
    built through fairseq's ``build_encoder_layer`` / ``build_decoder_layer`` (where fairseq
    wraps them): call each layer as ``call(layer, *inputs)``. fairseq's flags: offloading implies
    checkpointing."""
    offload = bool(getattr(args, "offload_activations", False))
    enabled = offload or bool(getattr(args, "checkpoint_activations", False))
    return functools.partial(call_checkpointed, enabled=enabled, offload=offload)
