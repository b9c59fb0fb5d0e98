"""Coarse and fine-grained layer attention (Liu et al., ICLR 2021, Sec. 3.2; Bapna et al., 2018)."""

from typing import List, Optional

import torch
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout

LAYER_ATTENTION_KINDS = ("none", "coarse", "fine")


class LayerAttention(nn.Module):
    """One source memory per decoder layer: S_m = sum_n W_mn (x) X_n, n = 0..N.

    Paper: Sec. 3.2, W in R^{M x (N+1) x D} with w_{m,n,d} = softmax over n of the learned
    w~_{m,n,d} (``fine``); ``coarse`` is the scalar-per-(m, n) layer attention of Bapna et al.
    (2018) that the paper compares against, W in R^{M x (N+1)}. X_0 is the word embedding
    without positions.

    DropConnect (Wan et al., 2013), p = 0.3 in the paper: "randomly drops each w_{m,n,d} with a
    probability p and divides W by 1 - p". Reading: the dropped elements are those of the
    learnable W, i.e. the logits w~ before the softmax, as the authors' released code does
    under its ``--ta-dropconnect`` flag; the softmax then renormalises, so the weights over
    encoder layers always sum to 1 in training as in evaluation. Dropping the normalised weights
    instead (the released code without that flag, its default, with p = 0.1) leaves sums
    anywhere from 0 up (std about 0.25 at p = 0.3) and zeroes the embedding layer on 30% of steps.
    Reading: the initial logits are zero, i.e. every decoder layer starts from the uniform
    average of the encoder layers (the paper does not state an initialisation; a dropped zero
    logit is still zero, so DropConnect acts only once the logits have moved away from 0). The
    released code draws them from U(-r, r), r = sqrt(2 / (M + N + 1)).

    Dropout around the sum (``embedding_dropout``; the model passes its --dropout). Paper: Sec. 3.2
    gives S_m as the weighted sum alone, X_0 as the word embeddings without positions, and
    DropConnect as the one regularisation it adds; App. A.1 keeps every other setting of the
    Transformer, which drops out the embedding sum X_emb + X_pos before layer 1 and every
    sub-layer output before its residual add. Reading: X_0 stands where that dropped embedding
    stands, so it gets the same dropout (rate --dropout, a mask of its own: fairseq's encoder does
    not hand its mask out); X_1..X_N carry their layers' dropout already, so S_m, a convex
    combination of them, carries dropout as the vanilla memory X_N does and gets no further one.
    In evaluation nothing changes. The released code differs: its X_0 is the word embedding under
    the encoder input's dropout mask, dropped again (a second, independent mask of the same rate)
    and layer-normalised; its S_m is layer-normalised and dropped at the DropConnect rate. The
    paper states neither LayerNorm nor the second dropouts, so they are not used here.

    ``masked_layer`` (analysis, Sec. 3.3 / Figure 2): that encoder layer's weight is set to zero
    and the others are renormalised (exactly w_n / (1 - w_masked)); encoding is unchanged.
    """

    def __init__(self, num_decoder_layers: int, num_encoder_layers: int, embed_dim: int, kind: str = "fine",
                 dropconnect: float = 0.0, embedding_dropout: float = 0.0):
        super().__init__()
        if kind not in LAYER_ATTENTION_KINDS[1:]:
            raise ValueError(f"layer attention kind {kind!r}; allowed: coarse, fine")
        self.kind = kind
        self.num_inputs = num_encoder_layers + 1
        self.dropconnect = FairseqDropout(dropconnect, module_name=type(self).__name__)
        self.embedding_dropout = FairseqDropout(embedding_dropout, module_name=type(self).__name__)
        width = embed_dim if kind == "fine" else 1
        self.logits = nn.Parameter(torch.zeros(num_decoder_layers, self.num_inputs, width))
        self.masked_layer: Optional[int] = None

    def mask_layer(self, layer: Optional[int]):
        """Mask encoder layer ``layer`` (0 = embedding) at inference; ``None`` unmasks."""
        if layer is not None and not 0 <= layer < self.num_inputs:
            raise ValueError(
                f"LayerAttention cannot mask input {layer}: its inputs are encoder layers 0 (embedding) "
                f"to {self.num_inputs - 1}")
        self.masked_layer = layer

    def weights(self) -> Tensor:
        """Normalised W, ``(M, N+1, D)`` for fine or ``(M, N+1, 1)`` for coarse, after DropConnect and masking."""
        # DropConnect on the learnable logits (dropout = drop single elements, rescale by 1 / (1 - p)),
        # before masking: a dropped -inf would be 0 * -inf = nan.
        logits = self.dropconnect(self.logits)
        if self.masked_layer is not None:
            logits = logits.index_fill(1, torch.tensor(self.masked_layer, device=logits.device), float("-inf"))
        return torch.softmax(logits.float(), dim=1).type_as(logits)

    def forward(self, layers: List[Tensor]) -> Tensor:
        """``layers``: N+1 tensors ``(src_len, batch, D)``, X_0 first (the word embeddings before
        any dropout). Returns ``(M, src_len, batch, D)``."""
        # X_0 is dropped out once, shared by every S_m, as the encoder's input embedding is
        embedding = self.embedding_dropout(layers[0])
        stacked = torch.stack([embedding, *layers[1:]], dim=0)
        weights = self.weights()
        if self.kind == "coarse":
            return torch.einsum("mn,ntbd->mtbd", weights.squeeze(-1), stacked)
        return torch.einsum("mnd,ntbd->mtbd", weights, stacked)
