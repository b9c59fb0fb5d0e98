"""DenseFormer's depth-weighted average (Pagliardini et al., NeurIPS 2024), as a stack wiring.

Paper: Sec. 3 and Fig. 1. With X_0 the embedding and X_i = B_i(Y_{i-1}) the output of
block i, a depth-weighted average (DWA) after block i hands the next block

    Y_i = sum_{j <= i} alpha_{i,j} X_j,        alpha_{i,i} = 1 and alpha_{i,j<i} = 0 at the start,

so the model starts as the plain Transformer. The k x p variants (Secs. 3.2-3.3, dilation
and periodicity): with dilation k, DWA i reads only the X_j with j = i (mod k); with
period p, only blocks i = p, 2p, ... are followed by a DWA, the others hand on X_i unchanged.
For k = p = 1 and d blocks this gives sum_{i=1}^{d} (i + 1) = d(d + 3)/2 scalars.

As the paper (Sec. 3) and the authors' package (``epfml/DenseFormer``, ``denseformer.DWAModules``)
have it, the weights average the block *outputs* X_j (not the earlier averages Y_j), and the last
block is followed by a DWA too, whose output goes to the final LayerNorm and the output projection.
Dilation counts blocks, as the text (Sec. 3.3's k = p = 4: the DWA after block 8 reads X_0, X_4,
X_8) and the package; the authors' training code (``experiments/models/denseformer.py``) stores only
the averaged blocks' outputs and counts dilation in those, so its (k, p) is the text's (kp, p):
``--denseformer-dilation`` k*p with ``--denseformer-period`` p trains it.
The weights are decayed with the rest by ``--weight-decay``, as in the authors' training code.

Reading for fairseq's post-norm layers (the paper's blocks are pre-norm): X_i is the layer's
normalised output, and the stack's output Y_L has no LayerNorm of its own (fairseq's post-norm
stacks end without one): Y_L = X_L at the start, a learned mix of normalised outputs and the
embedding once the weights move. In a pre-norm stack, fairseq's final LayerNorm follows Y_L as it
follows X_L, as the paper's follows its last DWA.

The stack records [Y_0, ..., Y_L] (Y_i = X_i after a block without DWA) as its states: the
representation each layer hands on, which MLRF fusion, layer attention and the layer-diversity
criterion read. Every weight mixes one position's states, so incremental decoding stays exact.
"""

from typing import List, Tuple

import torch
from torch import Tensor, nn

from .layer_aggregation import ApplyLayer, PlainStack


def averaged_blocks(num_layers: int, period: int) -> List[int]:
    """The blocks i (1-based) that a DWA follows."""
    return [block for block in range(1, num_layers + 1) if block % period == 0]


def averaged_outputs(block: int, dilation: int) -> List[int]:
    """The indices j of the outputs X_j that the DWA after block ``block`` weighs, in ascending order."""
    return list(range(block % dilation, block + 1, dilation))


class DepthWeightedAverage(PlainStack):
    """DenseFormer's stack: a DWA after every ``period``-th block over every ``dilation``-th output."""

    def __init__(self, num_layers: int, dilation: int = 1, period: int = 1):
        super().__init__(num_layers)
        self.dilation, self.period = dilation, period
        self.blocks = averaged_blocks(num_layers, period)
        counts = [len(averaged_outputs(block, dilation)) for block in self.blocks]
        # alpha_{i,i} = 1 on the block's own output (the last one read), alpha_{i,j<i} = 0
        self.alphas = nn.ParameterList(nn.Parameter(torch.arange(n).eq(n - 1).float()) for n in counts)
        self.position = {block: position for position, block in enumerate(self.blocks)}

    def weights(self) -> List[Tuple[int, List[int], Tensor]]:
        """(block i, the j it reads, alpha_i) for every DWA, for analysis."""
        return [(block, averaged_outputs(block, self.dilation), self.alphas[self.position[block]])
                for block in self.blocks]

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        outputs = [x0]  # X_0, X_1, ...
        states = [x0]  # Y_0, Y_1, ...
        for index in range(self.num_layers):
            outputs.append(apply_layer(index, states[-1], states))
            block = index + 1
            position = self.position.get(block)
            if position is None:
                states.append(outputs[-1])
                continue
            read = torch.stack([outputs[j] for j in averaged_outputs(block, self.dilation)], dim=-1)
            states.append(torch.matmul(read, self.alphas[position].to(read)))
        return states[-1], states
