"""Layer aggregation strategies of Dou et al. (EMNLP 2018), Sec. 3.1.1, Figures 1-2.

Each strategy owns the wiring of a layer stack: which representation enters layer l, and
what the stack outputs. The encoder or decoder hands it ``apply_layer(index, layer_input,
states)``, which runs its layer ``index`` (0-based) and returns the raw output; ``states`` is
the list of layer outputs so far, [H^0 (embedding), H^1, ...]. ``run`` returns the stack's
output and the full list [H^0, ..., H^L]. Every strategy combines states of the same position
only, so incremental decoding stays exact.
"""

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .aggregation_node import AggregationNode

AGGREGATION_STRATEGIES = ("none", "dense", "linear", "linear-output", "iterative", "hierarchical")
ApplyLayer = Callable[[int, Tensor, List[Tensor]], Tensor]


class PlainStack(nn.Module):
    """The vanilla stack: H^l = Layer(H^{l-1}), output H^L."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.num_layers = num_layers

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        states = [x0]
        for index in range(self.num_layers):
            states.append(apply_layer(index, states[-1], states))
        return states[-1], states


DENSE_CONNECTION_READINGS = ("layernorm", "literal", "sum", "mean")


class DenseConnection(PlainStack):
    """Eq. 4: H^l = Layer(H^{l-1}) + sum_{i=1}^{l-1} H^i (addition, no parameters).

    Paper: Eq. 4 and Table 1 (+0.0M, +0.30 BLEU), fine-tuned from a trained vanilla model.
    With O^l = Layer(H^{l-1}) the layer's own output (fairseq's layer, residual and LayerNorm
    included), four readings, none with parameters:

    * ``layernorm`` (default): Eq. 4 followed by a LayerNorm without parameters,
      H^l = LN(O^l + sum_{i=1}^{l-1} H^i): the literal direction at a layer output's scale.
    * ``literal``: Eq. 4 to the letter, the sum of the accumulated states H^i, which doubles
      every layer (H^l holds 2^{l-2} copies of H^1).
    * ``sum``: the layers' own outputs summed, H^l = sum_{i=1}^{l} O^i (DenseNet's "every layer
      reads every earlier layer", by addition); grows l times.
    * ``mean``: that sum divided by l, H^l = (1/l) sum_{i=1}^{l} O^i.

    Reading: ``layernorm``. ``literal`` and ``sum`` grow with depth (19 and 3.5 times the
    vanilla model's logit scale at 6 layers); of the four, ``layernorm`` keeps a layer output's
    scale at any depth and fine-tuned to the best BLEU from a trained vanilla model. The
    measurements and their commands: examples/deep_representations/README.md ("Dense
    connection: which reading of Eq. 4").
    """

    def __init__(self, num_layers: int, reading: str = "layernorm"):
        super().__init__(num_layers)
        if reading not in DENSE_CONNECTION_READINGS:
            raise ValueError(f"DenseConnection reading must be one of {', '.join(DENSE_CONNECTION_READINGS)}, got {reading!r}")
        self.reading = reading

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        states = [x0]
        running_sum: Optional[Tensor] = None  # sum of H^1..H^{l-1} (literal, layernorm) or O^1..O^{l-1}
        for index in range(self.num_layers):
            output = apply_layer(index, states[-1], states)
            total = output if running_sum is None else output + running_sum
            state = total
            if self.reading == "mean":
                state = total / (index + 1)
            elif self.reading == "layernorm":
                state = F.layer_norm(total, total.shape[-1:])
            if self.reading in ("literal", "layernorm"):
                running_sum = state if running_sum is None else running_sum + state
            else:
                running_sum = total
            states.append(state)
        return states[-1], states


def vanilla_combination(num_inputs: int, embed_dim: int) -> nn.Linear:
    """sum_i W_i H^i over ``num_inputs`` states, no bias, starting as the vanilla connection:
    the identity on the last state, zero on the others."""
    combination = nn.Linear(num_inputs * embed_dim, embed_dim, bias=False)
    with torch.no_grad():
        combination.weight.zero_()
        combination.weight[:, -embed_dim:] = torch.eye(embed_dim)
    return combination


class LinearCombination(PlainStack):
    """Figure 1c with Eq. 5's combination: the input of every layer, and the stack's output, is an
    unnormalised linear combination sum_i W_i H^i of all layers below it, H^0 included (Eq. 5
    itself combines H^1..H^L once, at the output: ``OutputLinearCombination``).

    Reading: one d x d matrix (no bias) per (combination, lower layer); with the combinations
    feeding layers 1..L and the output this gives (L+1)(L+2)/2 matrices per side, i.e. +14.7M
    on both sides of Transformer-Base (L=6, d=512), Table 1. Initialised so that each
    combination starts as the vanilla connection (identity on the layer just below, zero on
    the others), which is also what fine-tuning from a vanilla checkpoint wants.
    """

    def __init__(self, num_layers: int, embed_dim: int):
        super().__init__(num_layers)
        self.combinations = nn.ModuleList(vanilla_combination(count, embed_dim) for count in range(1, num_layers + 2))

    def combine(self, states: List[Tensor]) -> Tensor:
        return self.combinations[len(states) - 1](torch.cat(states, dim=-1))

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        states = [x0]
        for index in range(self.num_layers):
            states.append(apply_layer(index, self.combine(states), states))
        return self.combine(states), states


class OutputLinearCombination(PlainStack):
    """Eq. 5 as written: the vanilla stack, whose output is H-hat = sum_{l=1}^{L} W_l H^l, one
    d x d matrix (no bias) per layer, H^0 excluded (``--aggregate-encoder linear-output``).

    Paper: Eq. 5 combines the layers once, at the output; that gives L d^2 parameters a side,
    +3.1M on both sides of Transformer-Base, where Table 1 lists +14.7M for linear combination,
    which :class:`LinearCombination` (the default ``linear``) reproduces. Initialised as the
    vanilla output (identity on H^L, zero on the others).
    """

    def __init__(self, num_layers: int, embed_dim: int):
        super().__init__(num_layers)
        self.combination = vanilla_combination(num_layers, embed_dim)

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        _, states = super().run(x0, apply_layer)
        return self.combination(torch.cat(states[1:], dim=-1)), states


class IterativeAggregation(PlainStack):
    """Eqs. 6-7 and Figure 1d: H^_1 = H^1, H^_l = AGG(H^l, H^_{l-1}); the output is H^_L. The
    aggregation chain reads the backbone without feeding back into it."""

    def __init__(self, num_layers: int, make_node: Callable[[int, int], AggregationNode]):
        super().__init__(num_layers)
        self.nodes = nn.ModuleList(make_node(2, 0) for _ in range(num_layers - 1))

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        _, states = super().run(x0, apply_layer)
        aggregate = states[1]
        for node, layer_output in zip(self.nodes, states[2:]):
            aggregate = node(layer_output, aggregate)
        return aggregate, states


def hierarchical_tree(num_layers: int) -> List[Tuple[Tuple[int, ...], Optional[int]]]:
    """The aggregation nodes of hierarchical aggregation (Figure 2, filter size two): node i
    merges layers (2i+1, 2i+2) (1-based) and, for i > 0, node i-1. With an odd number of
    layers the last node merges the top layer with the node below it.
    Returns ``[(layers, previous_node or None), ...]``, e.g. for 3 layers
    ``[((1, 2), None), ((3,), 0)]``; a single layer needs no node."""
    if num_layers < 2:
        return []
    nodes = []
    for first in range(1, num_layers + 1, 2):
        layers = tuple(range(first, min(first + 2, num_layers + 1)))
        nodes.append((layers, len(nodes) - 1 if nodes else None))
    return nodes


class HierarchicalAggregation(PlainStack):
    """Sec. 3.1.1 and Figure 2b: H^_i = AGG(H^{2i-1}, H^{2i}) for i = 1, AGG(H^{2i-1}, H^{2i},
    H^_{i-1}) for i > 1; each node is fed back into the backbone as the input of the next
    sub-tree (layer 2i+1), and the top node is the stack's output."""

    def __init__(self, num_layers: int, make_node: Callable[[int, int], AggregationNode]):
        super().__init__(num_layers)
        self.tree = hierarchical_tree(num_layers)
        self.nodes = nn.ModuleList(
            make_node(len(layers) + (previous is not None), len(layers) - 1) for layers, previous in self.tree)
        self.node_after_layer = {layers[-1]: position for position, (layers, _) in enumerate(self.tree)}

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        states = [x0]
        layer_input = x0
        node_outputs: List[Tensor] = []
        for index in range(self.num_layers):
            states.append(apply_layer(index, layer_input, states))
            layer_input = states[-1]
            position = self.node_after_layer.get(index + 1)
            if position is not None:
                layers, previous = self.tree[position]
                inputs = [states[layer] for layer in layers] + ([node_outputs[previous]] if previous is not None else [])
                node_outputs.append(self.nodes[position](*inputs))
                layer_input = node_outputs[-1]
        return (node_outputs[-1] if node_outputs else states[-1]), states


def build_layer_aggregation(strategy: str, num_layers: int, embed_dim: int, hidden_dim: int,
                            function: str = "sigmoid", residual: str = "all", num_heads: int = 1,
                            dense_reading: str = "layernorm", dropout: float = 0.0) -> PlainStack:
    """The stack wiring for ``strategy`` in :data:`AGGREGATION_STRATEGIES`; ``dropout`` is the
    aggregation nodes' (see :class:`AggregationNode`)."""
    def make_node(num_inputs: int, top_input: int) -> AggregationNode:
        return AggregationNode(num_inputs, embed_dim, hidden_dim, function, residual, top_input, num_heads, dropout)

    if strategy == "none":
        return PlainStack(num_layers)
    if strategy == "dense":
        return DenseConnection(num_layers, dense_reading)
    if strategy == "linear":
        return LinearCombination(num_layers, embed_dim)
    if strategy == "linear-output":
        return OutputLinearCombination(num_layers, embed_dim)
    if strategy == "iterative":
        return IterativeAggregation(num_layers, make_node)
    if strategy == "hierarchical":
        return HierarchicalAggregation(num_layers, make_node)
    raise ValueError(f"unknown aggregation {strategy!r}; allowed: {', '.join(AGGREGATION_STRATEGIES)}")
