"""Dense connections and summary layers of DenseNMT (Shen et al., NAACL 2018, Sec. 3.1 and 3.3).

A dense stack keeps a list of feature blocks ``[h0, h1, ..., hl]``; layer ``l+1`` reads their
concatenation (Eq. 6 for the encoder, Eq. 7 for the decoder, where each decoder layer adds two
blocks, its hidden state ``z_l`` and its attention value ``a_l``). A summary layer (Sec. 3.3)
projects the concatenation back to the embedding size ``d0`` and restarts the list with that one
block, so no encoder layer reads more than ``d0 + (sumlen - 1) * d`` features, no decoder layer more
than ``d0 + 2 (sumlen - 1) * d``.

Pure module code: the plan of widths is computed from plain integers (no argparse).
"""

from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from .dense_attention import weight_normed_linear


@dataclass(frozen=True)
class DenseStep:
    """One step of a dense stack: a ``"layer"`` that reads ``in_dim`` features and appends
    ``out_dim`` new ones, or a ``"summary"`` that reads ``in_dim`` and restarts the stack with
    ``out_dim`` (= d0) features."""

    kind: str
    in_dim: int
    out_dim: int


def summary_positions(num_layers: int, summary_every: int) -> List[int]:
    """Indices (0-based) of the layers followed by a summary layer.

    Paper: Sec. 3.3, "We add one summary layer after every (sumlen - 1) layers". Reading: no
    summary after the top layer, whose concatenation is read by the output projection instead
    (which is itself a projection of the top block, "the output of the decoder is only a linear
    transformation of the concatenation of the upper few layers").
    """
    if summary_every == 0:
        return []
    interval = summary_every - 1
    return [index for index in range(num_layers) if (index + 1) % interval == 0 and index + 1 < num_layers]


def dense_plan(new_features: Sequence[int], embed_dim: int, summary_every: int = 0) -> List[DenseStep]:
    """The widths of a dense stack: layer ``l`` appends ``new_features[l]`` features (the growth
    dimension d, or 2d for a decoder layer with attention, Eq. 7) to a stack that starts with the
    embedding (``embed_dim`` = d0). Paper: Sec. 3.3, the L-th layer reads ``(L - 1) d + d0``."""
    summaries = set(summary_positions(len(new_features), summary_every))
    plan, width = [], embed_dim
    for index, grown in enumerate(new_features):
        plan.append(DenseStep("layer", width, grown))
        width += grown
        if index in summaries:
            plan.append(DenseStep("summary", width, embed_dim))
            width = embed_dim
    return plan


def final_width(plan: Sequence[DenseStep]) -> int:
    """Width of the concatenation after the last step (what the output projection reads): the top
    layer's input and its new features, as no summary layer follows the top layer."""
    return plan[-1].in_dim + plan[-1].out_dim


def block_sizes(plan: Sequence[DenseStep]) -> List[int]:
    """For the final block (after the last summary): the widths of its feature blocks, the
    summary output first when there is one. Dense attention (Sec. 3.2/3.3) attends these."""
    blocks: List[int] = []
    for step in plan:
        if step.kind == "summary":
            blocks = [step.out_dim]
        else:
            blocks.append(step.out_dim)
    return blocks


class DenseFeatures:
    """The growing list ``[h_l, ..., h_0]`` of Eq. 6/7, kept oldest first along the last dimension."""

    def __init__(self, first: Tensor):
        self.blocks: List[Tensor] = [first]
        self.restarted = False  # by a summary layer, whose output is the first block

    def concat(self) -> Tensor:
        return self.blocks[0] if len(self.blocks) == 1 else torch.cat(self.blocks, dim=-1)

    def top_block(self) -> List[Tensor]:
        """The blocks since the last summary layer, its output first (the embedding h0 is none of
        them): what dense attention attends (:func:`block_sizes`)."""
        return self.blocks if self.restarted else self.blocks[1:]


def build_dense_stack(stack: nn.Module, new_features: Sequence[int], embed_dim: int, summary_every: int,
                      make_layer: Callable, make_summary: Callable) -> Tuple[List[nn.Module], List[int], int]:
    """The layers of a dense stack (:func:`dense_plan`), ``make_layer(index, in_dim)``, built in the
    plan's order with the summary layers ``make_summary(index, in_dim)`` (after layer ``index``,
    put in ``stack.summaries`` keyed by ``str(index)``); sets ``stack.layer_input_widths``. Returns
    the layers, the widths of the top block (:func:`block_sizes`) and the output width."""
    plan = dense_plan(new_features, embed_dim, summary_every)
    layers, summaries = [], {}
    for step in plan:
        if step.kind == "layer":
            layers.append(make_layer(len(layers), step.in_dim))
        else:
            summaries[str(len(layers) - 1)] = make_summary(len(layers) - 1, step.in_dim)
    stack.summaries = nn.ModuleDict(summaries)
    stack.layer_input_widths = [step.in_dim for step in plan]
    return layers, block_sizes(plan), final_width(plan)


def run_dense(x: Tensor, num_layers: int, apply_layer: Callable, summaries, summarise: Callable) -> DenseFeatures:
    """Eq. 6/7: ``apply_layer(index, features)`` reads the concatenation of every block so far and
    returns the blocks it adds; ``summarise(summary, features)`` restarts the stack (Sec. 3.3)."""
    features = DenseFeatures(x)
    for index in range(num_layers):
        features.blocks.extend(apply_layer(index, features.concat()))
        if str(index) in summaries:
            features.blocks, features.restarted = [summarise(summaries[str(index)], features.concat())], True
    return features


class SummaryLayer(nn.Module):
    """Sec. 3.3: "summarizes the features for all previous layers and projects back to the
    embedding size". Reading: a position-wise linear projection (no non-linearity; the paper gives
    none), initialised as ConvS2S's linear layers (std sqrt((1 - dropout) / in_dim)), optionally
    weight-normalised as ConvS2S's layers are."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0, weight_norm: bool = True):
        super().__init__()
        self.projection = weight_normed_linear(in_dim, out_dim, dropout, weight_norm)

    def forward(self, features: Tensor) -> Tensor:
        return self.projection(features)
