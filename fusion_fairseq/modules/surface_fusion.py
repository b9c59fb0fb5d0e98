"""The fusion functions Phi of SurfaceFusion (Liu et al., ICLR 2021, Eqs. 5-7), as the paper's
text describes it and as the authors' released code (github.com/SunbowLiu/SurfaceFusion) trains it."""

import math
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout

from .feedforward_fusion import FeedForward
from .surface_attention import SurfaceAttention

SURFACE_FUSION_KINDS = ("none", "hard", "soft")
SURFACE_FUSION_VARIANTS = ("paper", "released")
# how the released code's fairseq 0.9 attention starts its query, key and value projections
FAIRSEQ_ATTENTION_INIT = {"qkv_gain": 1 / math.sqrt(2), "zero_qkv_biases": False}


def surface_log_probs(surface_logits: Tensor, tau: float) -> Tensor:
    """Eq. 5: log P(y_j | x) = log softmax(E_r(y_j, x) / tau)."""
    return torch.log_softmax(surface_logits.float() / tau, dim=-1)


def hard_fusion(decoder_logits: Tensor, surface_logits: Tensor, lam: float, tau: float) -> Tensor:
    """Eq. 6: Phi_hard = lambda log P(y_j | y_<j, x) + (1 - lambda) log P(y_j | x).

    Reading: as written, a log-linear interpolation that is not renormalised (for 0 < lambda < 1
    the exponentiated scores sum to at most 1, by Hoelder's inequality); training on it is the
    lambda-weighted sum of the two negative log-likelihoods. lambda = 1 gives the vanilla model.
    """
    decoder_log_probs = torch.log_softmax(decoder_logits.float(), dim=-1)
    if lam == 1.0:
        return decoder_log_probs
    return lam * decoder_log_probs + (1.0 - lam) * surface_log_probs(surface_logits, tau)


def soft_fusion(decoder_logits: Tensor, surface_logits: Tensor, tau: float) -> Tensor:
    """Eq. 7: Phi_soft = log softmax(E(y_j | y_<j, x) + log P(y_j | x)), a normalised distribution."""
    return torch.log_softmax(decoder_logits.float() + surface_log_probs(surface_logits, tau), dim=-1)


class ResidualFeedForward(nn.Module):
    """x + dropout(FFN(x)): the released code's output FFN (ReLU, dropout on the hidden units and on
    the output, no layer normalisation). Weights Xavier-uniform and biases zero, as fairseq's
    ``Linear`` that the released code builds it with."""

    def __init__(self, embed_dim: int, ffn_dim: int, dropout: float, activation_dropout: float):
        super().__init__()
        self.ffn = FeedForward(embed_dim, ffn_dim, embed_dim, dropout=activation_dropout)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        for linear in (self.ffn.fc1, self.ffn.fc2):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.dropout_module(self.ffn(x))


class SurfaceFusion(nn.Module):
    """SurfaceFusion (Sec. 4.1): the surface attention r(y_j, x) over the source word embeddings,
    projected by the model's own pre-softmax weights V (passed in, not owned) into surface logits,
    fused with the decoder's logits by Phi (``hard`` Eq. 6 or ``soft`` Eq. 7) into log-scores.

    ``variant="paper"``: the paper's text. ``num_heads`` heads (the model passes the decoder's; the
    paper states no number); gradients reach the decoder and the encoder through the query y^M_j and
    the keys X_N; the decoder output and r(y_j, x) go to the output projection as they are.

    ``variant="released"``: the authors' released code, which Table 2 and Figure 4 come from, and
    which differs from the text in four ways the paper does not state:
      1. the query and the keys are detached: the surface attention's loss trains only its own
         projections and the source embeddings (through the values);
      2. one attention head (``num_heads`` is ignored);
      3. one residual FFN (``d -> ffn_dim -> d``, ReLU), shared, is applied to both the decoder
         output and the surface vector before the output projection: it changes the decoder's own
         prediction too and adds 2 d ffn_dim + ffn_dim + d parameters;
      4. dropout (``embedding_dropout``, the model's --dropout) on the embedding values.
    Reading of 4: the released code reuses the mask of the encoder's input dropout for the values;
    here the values get their own mask of the same rate (the encoder does not hand its mask out).
    Initialisation (the paper states none): ``paper`` Xavier-uniform projections with zero biases;
    ``released`` as the released code's fairseq 0.9 ``MultiheadAttention``: query, key and value
    weights Xavier-uniform at gain 1/sqrt(2) with torch's default biases, the output projection at
    gain 1 with a zero bias.
    Both variants share Phi: the released code's ``hard`` mode is Eq. 6 with tau = 1 and its
    ``soft_5`` mode Eq. 7 with tau = 5. Its query is the output of decoder layer 6 (``--sf-idx 5``)
    before any final LayerNorm, which for the post-norm 6-layer models of the paper is the decoder
    output used here.
    """

    def __init__(self, kind: str, embed_dim: int, num_heads: int, lam: float, tau: float, dropout: float = 0.0,
                 variant: str = "paper", ffn_dim: int = 0, embedding_dropout: float = 0.0,
                 activation_dropout: float = 0.0):
        super().__init__()
        if kind not in SURFACE_FUSION_KINDS[1:]:
            raise ValueError(f"SurfaceFusion kind must be hard or soft, got {kind!r}")
        if variant not in SURFACE_FUSION_VARIANTS:
            raise ValueError(f"SurfaceFusion variant must be one of {', '.join(SURFACE_FUSION_VARIANTS)}, got {variant!r}")
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"SurfaceFusion lam (Eq. 6) must be in [0, 1], got {lam!r}")
        if not tau > 0.0:
            raise ValueError(f"SurfaceFusion tau (Eq. 5) must be > 0, got {tau!r}")
        self.kind = kind
        self.lam = lam
        self.tau = tau
        self.released = variant == "released"
        self.embedding_dropout = FairseqDropout(embedding_dropout if self.released else 0.0,
                                                module_name=type(self).__name__)
        self.attention = SurfaceAttention(embed_dim, 1 if self.released else num_heads, dropout,
                                          **(FAIRSEQ_ATTENTION_INIT if self.released else {}))
        self.output_ffn = None
        if self.released:
            if ffn_dim <= 0:
                raise ValueError(f"SurfaceFusion variant released needs ffn_dim > 0, got {ffn_dim!r}")
            self.output_ffn = ResidualFeedForward(embed_dim, ffn_dim, embedding_dropout, activation_dropout)

    def forward(self, decoder_features: Tensor, encoder_out: Dict[str, List[Tensor]],
                output_projection: Callable[[Tensor], Tensor],
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        """``decoder_features`` ``(batch, tgt_len, D)`` are the query y^M_j; ``output_projection``
        the model's pre-softmax layer. Returns the fused log-scores over the vocabulary."""
        padding_mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        query, keys = decoder_features, encoder_out["encoder_out"][0].transpose(0, 1)
        values = encoder_out["encoder_embedding"][0]
        if self.released:
            query, keys = query.detach(), keys.detach()
            values = self.embedding_dropout(values)
        surface = self.attention(query, keys=keys, values=values, key_padding_mask=padding_mask,
                                 incremental_state=incremental_state)
        # one product with the output matrix for both: the largest matrix of a small model is read once
        batch = decoder_features.size(0)
        features = torch.cat([decoder_features, surface], dim=0)
        if self.output_ffn is not None:
            features = self.output_ffn(features)
        logits = output_projection(features)
        if self.kind == "hard":
            return hard_fusion(logits[:batch], logits[batch:], self.lam, self.tau)
        return soft_fusion(logits[:batch], logits[batch:], self.tau)
