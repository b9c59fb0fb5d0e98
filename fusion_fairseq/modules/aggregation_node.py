"""The aggregation node AGG of Dou et al. (EMNLP 2018), Eq. 7 and Sec. 4.3.3 (Table 4)."""

from typing import List

import torch
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout

from .init import fan_in_uniform_

AGGREGATION_FUNCTIONS = ("sigmoid", "relu", "attention")
AGGREGATION_RESIDUALS = ("none", "top", "all")


class AggregationNode(nn.Module):
    """AGG(x_1, ..., x_k) = LN(F([x_1; ...; x_k]) + residual).

    Paper: Eq. 7 (two inputs) and its three-input form in Sec. 3.1.1: F is a feed-forward
    network over the concatenated inputs "with a sigmoid activation in between", and every input
    has a residual connection to the output. Table 4 varies both:
      ``function``: ``sigmoid`` (paper default) / ``relu`` FFN, or ``attention`` (Table 4's
        "multihead self-attention layer"; reading: self-attention over the k inputs of each
        position, whose k outputs are summed);
      ``residual``: ``all`` inputs (paper default), only the ``top`` input, or ``none``.
    Reading: the FFN's hidden size is the model's filter size (2048 for Transformer-Base); this
    reproduces the parameter counts of Table 1 (+31.5M for iterative, +23.1M for hierarchical
    aggregation on both sides of Transformer-Base).
    ``top_input`` is the index (in call order) of the highest backbone layer among the inputs.

    ``dropout``: on F's output before the residual sum. Paper: Eq. 7 states no dropout, and Sec. 4.1
    keeps the configuration of Vaswani et al., whose every sublayer's output is dropped out before
    its residual sum. Reading: AGG has the shape of such a sublayer, LN(F(x) + x), and gets the
    model's ``--dropout`` there, as the layers whose outputs it merges do; without it, an iterative
    or hierarchical node would hand the next layer and the output projection an undropped path.
    A node inside multi-layer attention (Eq. 8) takes 0: the layer drops its attention's output.
    """

    def __init__(self, num_inputs: int, embed_dim: int, hidden_dim: int, function: str = "sigmoid",
                 residual: str = "all", top_input: int = 0, num_heads: int = 1, dropout: float = 0.0):
        super().__init__()
        if function not in AGGREGATION_FUNCTIONS:
            raise ValueError(f"AggregationNode function must be one of {', '.join(AGGREGATION_FUNCTIONS)}, got {function!r}")
        if residual not in AGGREGATION_RESIDUALS:
            raise ValueError(f"AggregationNode residual must be one of {', '.join(AGGREGATION_RESIDUALS)}, got {residual!r}")
        self.num_inputs = num_inputs
        self.function = function
        self.residual = residual
        self.top_input = top_input
        if function == "attention":
            self.attention = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        else:
            self.fc1 = nn.Linear(num_inputs * embed_dim, hidden_dim)
            self.fc2 = nn.Linear(hidden_dim, embed_dim)
            fan_in_uniform_(self.fc1)
            fan_in_uniform_(self.fc2)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.layer_norm = nn.LayerNorm(embed_dim)

    def transform(self, inputs: List[Tensor]) -> Tensor:
        if self.function == "attention":
            stacked = torch.stack(inputs, dim=-2)  # (..., k, d): the k inputs of one position
            flat = stacked.reshape(-1, self.num_inputs, stacked.size(-1))
            attended, _ = self.attention(flat, flat, flat, need_weights=False)
            return attended.sum(dim=1).view(stacked.shape[:-2] + stacked.shape[-1:])
        hidden = self.fc1(torch.cat(inputs, dim=-1))
        hidden = torch.sigmoid(hidden) if self.function == "sigmoid" else torch.relu(hidden)
        return self.fc2(hidden)

    def forward(self, *inputs: Tensor) -> Tensor:
        if len(inputs) != self.num_inputs:
            raise ValueError(f"aggregation node built for {self.num_inputs} inputs got {len(inputs)}")
        output = self.dropout_module(self.transform(list(inputs)))
        if self.residual == "all":
            output = output + sum(inputs)
        elif self.residual == "top":
            output = output + inputs[self.top_input]
        return self.layer_norm(output)

    def input_weight_blocks(self) -> List[Tensor]:
        """The block of the first FFN matrix that reads each input (for the exploitation score
        of Eq. 11); not defined for the attention function."""
        if self.function == "attention":
            raise ValueError("the exploitation score (Eq. 11) needs FFN aggregation, not the attention function")
        return list(self.fc1.weight.chunk(self.num_inputs, dim=1))
