"""MUDDFormer's multiway dynamic dense connections (Xiao et al., ICML 2025, arXiv 2502.12170), as a
stack wiring.

Paper: Eqs. 5-8. With X_0 the embedding and X_i the output of block i, a depth-wise aggregate DA
after block i mixes the outputs X_{:i} = (X_0, ..., X_i) of one position with weights generated
from that position's X_i, separately for each of the next block's four inputs, the ways
query, key, value and residual (Q, K, V, R):

    A_i(X_i) = GELU(RMSNorm(X_i) W_1) W_2 + a_i                            (Eq. 6)
    Xbar_i^w = sum_{j=0}^{i} A_i^w[j] X_j,   w in (Q, K, V, R)             (Eqs. 5, 8)
    X_{i+1} = B'(Xbar_i^Q, Xbar_i^K, Xbar_i^V, Xbar_i^R)                   (Eq. 8)
    B'(Q, K, V, R) = FFN(LN(X_A)) + X_A,  X_A = MHA(LN(Q), LN(K), LN(V)) + R   (Eq. 7)

and the stack's output is Xbar_L^R. The block B' is ``models/multiway_dense_layers.py``; this
module generates the weights and mixes the outputs. One multilayer perceptron per DA generates the
weights of all its ways at once (Appendix B; Sec. 2.3 notes the four per-way modules of Eq. 8 are
combined "for efficiency").

Readings, each where the text leaves a choice:

* Eq. 6 normalisation. Paper: RMSNorm(X_i) "to stabilize training". Reading: RMSNorm without a
  learned scale (eps 1e-6), as the released PyTorch code (``RMSnormNoscale``); a scale would be a
  parameter Eq. 13's count does not have. GELU is the exact one, as the PyTorch code's ``nn.GELU()``
  (the JAX training code's flax ``gelu`` is the tanh approximation by default).
* Sizes. Paper: W_1 in R^{D x K_i}, W_2 in R^{K_i x C(i+1)}, a_i in R^{C x (i+1)} with C = 4 ways
  and hidden size K_i = C(i+1) (Sec. 2.2 for one way, Appendix B's pseudocode for four). Reading,
  for the last DA: only Xbar_L^R is read (Eq. 8's output), so it generates the residual way only
  (C = 1, the released code's ``dynamic_dense_fix_last_layer``) with the same hidden size K_L =
  4(L+1) (the released ``expand_last``); Q, K, V weights there would be parameters without a use.
* ``variant``. ``paper``: K_i as above. ``released``: K_i rounded up past the next multiple of
  64, (K_i // 64 + 1) * 64, as the released configurations (``round64``, JAX
  ``dynamic_dense_hidden_round``) size the hidden layer.
* Initialisation. Paper, Sec. 3 "Implementation Details": W_1 ~ N(0, 1/D), W_2 = 0, a_i = 1 at
  a_ii and 0 elsewhere, which "reduces MUDDFormer to Transformer at the beginning of training"
  (the JAX training code does the same; the released PyTorch code's ``torch.randn`` for a_i is a
  placeholder its checkpoints overwrite). Every way then starts as X_i, and the model as the
  Transformer whose layers it runs.
* Sec. 2.4's parameter re-allocation (FFN widths growing with depth) and Sec. 2.5's optional
  PreDANorm/PostDANorm change the trunk and are not implemented here: the trunk stays fairseq's.

Parameters of a stack of L layers of width D (Eq. 13 counts the first two terms, its K_i^2 being
K_i C_i (i+1) for i < L; a_i adds the third):
sum_{i=1}^{L} D K_i + K_i C_i (i+1) + C_i (i+1), with C_i = 4 for i < L, C_L = 1 and K_i = 4(i+1)
(``paper``).

The stack records [X_0, Xbar_1^R, ..., Xbar_L^R] as its states: the residual stream each layer
hands on (the stack's output last), which MLRF fusion, layer attention and the layer-diversity
criterion read. Every weight mixes one position's outputs, so incremental decoding stays exact.
"""

from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layer_aggregation import ApplyLayer, PlainStack

WAYS = ("query", "key", "value", "residual")  # the order of the ways in the tensors below
MUDD_VARIANTS = ("paper", "released")
RMS_NORM_EPS = 1e-6


def generator_hidden_size(num_inputs: int, variant: str) -> int:
    """K_i for a DA over ``num_inputs`` = i + 1 outputs: 4(i+1), or the released rounding of it."""
    size = len(WAYS) * num_inputs
    if variant == "paper":
        return size
    if variant == "released":
        return (size // 64 + 1) * 64
    raise ValueError(f"MUDD variant must be one of {', '.join(MUDD_VARIANTS)}, got {variant!r}")


class DynamicDenseWeights(nn.Module):
    """A_i of Eq. 6: the weights of ``num_ways`` ways over ``num_inputs`` outputs, from X_i."""

    def __init__(self, embed_dim: int, num_inputs: int, num_ways: int, hidden_size: int):
        super().__init__()
        self.num_inputs, self.num_ways = num_inputs, num_ways
        self.w1 = nn.Linear(embed_dim, hidden_size, bias=False)
        self.w2 = nn.Linear(hidden_size, num_ways * num_inputs, bias=False)
        nn.init.normal_(self.w1.weight, std=embed_dim ** -0.5)
        nn.init.zeros_(self.w2.weight)
        # a_i: 1 on the block's own output X_i (the last one read), 0 on the others, for every way
        self.static = nn.Parameter(torch.arange(num_inputs).eq(num_inputs - 1).float().repeat(num_ways, 1))

    def forward(self, x: Tensor) -> Tensor:
        """``(..., D)`` -> ``(..., ways, inputs)``."""
        normalised = F.rms_norm(x, x.shape[-1:], eps=RMS_NORM_EPS)
        dynamic = self.w2(F.gelu(self.w1(normalised)))
        return dynamic.unflatten(-1, (self.num_ways, self.num_inputs)) + self.static


class MultiwayDynamicDense(PlainStack):
    """MUDDFormer's stack: each layer reads the four ways ``T x B x 4 x C`` (:data:`WAYS` order),
    the first one X_0 in every way; a DA follows every layer."""

    def __init__(self, num_layers: int, embed_dim: int, variant: str = "paper"):
        super().__init__(num_layers)
        self.variant = variant
        self.generators = nn.ModuleList(
            DynamicDenseWeights(embed_dim, block + 1, len(WAYS) if block < num_layers else 1,
                                generator_hidden_size(block + 1, variant))
            for block in range(1, num_layers + 1))

    def run(self, x0: Tensor, apply_layer: ApplyLayer) -> Tuple[Tensor, List[Tensor]]:
        outputs = [x0]  # X_0, X_1, ...
        states = [x0]  # X_0, Xbar_1^R, ...
        ways = x0.unsqueeze(-2).expand(*x0.shape[:-1], len(WAYS), x0.shape[-1])
        for index, generator in enumerate(self.generators):
            outputs.append(apply_layer(index, ways, states))
            weights = generator(outputs[-1])  # T x B x ways x (i+1)
            ways = torch.matmul(weights, torch.stack(outputs, dim=-2))  # Eq. 5 for every way
            states.append(ways[..., -1, :])  # the residual way
        return states[-1], states
