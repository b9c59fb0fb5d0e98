"""Single-hidden-layer FNN fusion (MLRF, Sec. 3.2 "Fusion by Feed-forward Neural Network")."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout

from .init import fan_in_uniform_


class FeedForward(nn.Module):
    """``in_dim -> hidden_dim -> out_dim`` with ReLU and dropout on the hidden units.

    The MLRF paper names a "single hidden layer FNN with df hidden units" without its activation;
    Reading: ReLU, the Transformer's own FFN activation.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, out_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        fan_in_uniform_(self.fc1)
        fan_in_uniform_(self.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout_module(F.relu(self.fc1(x)))
        return self.fc2(hidden)


def layer_embedding_rows(layer_embedding: Optional[nn.Embedding], first_layer_index: int, num_layers: int) -> Tensor:
    """The rows of the shared layer embedding E (MLRF Eq. 4) that ``num_layers`` fused layers read,
    ``first_layer_index`` (0 when h0 is fused, 1 otherwise) onwards; checks that E has them."""
    if layer_embedding is not None and first_layer_index + num_layers > layer_embedding.num_embeddings:
        raise ValueError(
            f"layer embedding has {layer_embedding.num_embeddings} rows, "
            f"fusing layers {first_layer_index}..{first_layer_index + num_layers - 1} needs more")
    return torch.arange(first_layer_index, first_layer_index + num_layers)


class FeedForwardFusion(nn.Module):
    """phi(Z_j) = FNN([z~^1_j; ...; z~^L_j]): the L layers, each with its layer embedding added
    (Eq. 4, z~^l = z^l + E_l, optional), concatenated into one L*d vector.

    Paper: Sec. 3.2 introduces the layer embedding with self-attention fusion, and Table 4
    ablates it for Enc-FNN (33.31 -> 33.17 BLEU without it), so the FNN fusion reads the same
    shared table E. Reading: the average fusion has none (a layer embedding would only add the
    constant mean of E's rows; Table 4 does not ablate it for AVG).

    Input ``layers``: ``(..., L, d)``; output ``(..., d)``.
    Parameters: (L*d)*df + df + df*d + d, e.g. 656,128 for L=4 (h0..h3), d=256, df=512, which
    with the L*d = 1,024 of the shared layer embedding and the 512 of the LayerNorm after the
    fusion is the 657,664 between Enc-FNN and the baseline in MLRF Table 2 (11.63M - 10.97M).
    """

    def __init__(self, num_layers: int, embed_dim: int, ffn_dim: int, dropout: float = 0.0,
                 layer_embedding: Optional[nn.Embedding] = None, first_layer_index: int = 0):
        super().__init__()
        self.num_layers = num_layers
        self.ffn = FeedForward(num_layers * embed_dim, ffn_dim, embed_dim, dropout)
        self.layer_embedding = layer_embedding
        self.register_buffer("layer_ids", layer_embedding_rows(layer_embedding, first_layer_index, num_layers),
                             persistent=False)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        if self.layer_embedding is not None:
            layers = layers + self.layer_embedding(self.layer_ids)  # Eq. 4
        return self.ffn(layers.flatten(start_dim=-2))
