"""The fusion functions Phi of SurfaceFusion (Liu et al., ICLR 2021, Eqs. 5-7)."""

from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

from .surface_attention import SurfaceAttention

SURFACE_FUSION_KINDS = ("none", "hard", "soft")


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


def fuse_output_distribution(kind: str, decoder_logits: Tensor, surface_logits: Tensor, lam: float, tau: float) -> Tensor:
    """Fused log-scores over the target vocabulary for ``kind`` in ``hard`` / ``soft``."""
    if kind == "hard":
        return hard_fusion(decoder_logits, surface_logits, lam, tau)
    if kind == "soft":
        return soft_fusion(decoder_logits, surface_logits, tau)
    raise ValueError(f"--surface-fusion {kind!r}; allowed: {', '.join(SURFACE_FUSION_KINDS)}")


class SurfaceFusion(nn.Module):
    """SurfaceFusion (Sec. 4.1): the surface attention r(y_j, x) over the source word embeddings,
    projected by the model's own pre-softmax weights V (passed in, not owned) into surface logits,
    fused with the decoder's logits by Phi (``hard`` Eq. 6 or ``soft`` Eq. 7) into log-scores.
    """

    def __init__(self, kind: str, embed_dim: int, num_heads: int, lam: float, tau: float, dropout: float = 0.0):
        super().__init__()
        if kind not in SURFACE_FUSION_KINDS[1:]:
            raise ValueError(f"--surface-fusion {kind!r}; allowed: hard, soft")
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"--surface-fusion-lambda must be in [0, 1], got {lam!r}")
        if not tau > 0.0:
            raise ValueError(f"--surface-fusion-tau must be > 0, got {tau!r}")
        self.kind = kind
        self.lam = lam
        self.tau = tau
        self.attention = SurfaceAttention(embed_dim, num_heads, dropout)

    def forward(self, decoder_features: Tensor, encoder_out: Dict[str, List[Tensor]],
                output_projection: Callable[[Tensor], Tensor],
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        """``decoder_features`` ``(batch, tgt_len, D)`` are the query y^M_j; ``output_projection``
        the model's pre-softmax layer. Returns the fused log-scores over the vocabulary."""
        padding_mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        surface = self.attention(
            decoder_features,
            keys=encoder_out["encoder_out"][0].transpose(0, 1),
            values=encoder_out["encoder_embedding"][0],
            key_padding_mask=padding_mask,
            incremental_state=incremental_state,
        )
        # one product with the output matrix for both: the largest matrix of a small model is read once
        batch = decoder_features.size(0)
        logits = output_projection(torch.cat([decoder_features, surface], dim=0))
        return fuse_output_distribution(self.kind, logits[:batch], logits[batch:], self.lam, self.tau)
