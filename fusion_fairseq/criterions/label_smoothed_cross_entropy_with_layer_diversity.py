"""``--criterion label_smoothed_cross_entropy_with_layer_diversity``: fairseq's label-smoothed
cross-entropy plus the layer-diversity regulariser of Dou et al. (2018), Sec. 3.2, Eqs. 9-10.

Eq. 9 reads L = L_likelihood + lambda * L_diversity for a regulariser that should "encourage the
diversities between layers": an objective to *maximise*, likelihood and diversity both rewarded.
fairseq minimises a loss, so this criterion minimises

    loss = LS_NLL - lambda * L_div * sample_size

where LS_NLL is ``label_smoothed_cross_entropy``'s loss, summed over target tokens as in fairseq,
and L_div is Eq. 10 (see :mod:`fusion_fairseq.modules.layer_diversity`): the mean over adjacent
layer pairs (H^l, H^{l+1}), l = 1..L-1, of the mean cosine-squared distance over non-padding
positions, on the layer outputs only (the embedding output is not a layer).

Readings:
  * Sides (``--diversity-sides``, default ``both``): the encoder stack (``extra["encoder_states"]``)
    and the decoder stack (``extra["inner_states"]``) each get their own Eq. 10 (a side with fewer than
    2 layers is skipped), *summed* by default (L_div in [0, 2]): each side's diversity weighs as much
    as it would alone. Eq. 9 has one L_diversity and does not say how the two stacks combine:
    ``--diversity-combine mean`` averages them instead (an effective lambda of 1/2 per side).
  * Scale: fairseq divides the summed LS_NLL by ``sample_size`` (ntokens, or sentences under
    ``--sentence-avg``), while L_div is a mean; multiplying L_div by ``sample_size``
    makes the per-token objective ``LS_NLL / sample_size - lambda * L_div``, so lambda has the
    paper's meaning (1.0 in the paper, the default here).
  * Batch: L_div is the mean of the sentences' Eq. 10 weighted as fairseq weighs their losses (each
    sentence's target tokens, or 1 under ``--sentence-avg``), so that the regulariser, like the loss,
    is a sum over sentences: ``--update-freq`` and several processes give the loss of the one large
    batch. For the decoder without ``--sentence-avg`` this is the mean over all target positions; the
    encoder's positions were once pooled over the batch instead, which split batches did not add up to.
  * Reported ``loss`` includes the regulariser (it may go below 0); ``nll_loss``/``ppl`` do not
    (``--best-checkpoint-metric nll_loss`` keeps it out of checkpoint selection).
    ``layer_diversity`` (and ``_encoder``/``_decoder``) report L_div itself, weighted as the loss.
  * ``reduce=False``: the regulariser has no per-token share; the unreduced loss is returned unchanged.

The model returns its layer states without a second forward pass: ``fusion_transformer`` puts the
encoder's [h0..hL] and ``encoder_padding_mask`` in ``extra`` beside the decoder's ``inner_states``.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics

from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.modules.layer_diversity import layer_diversity
from fusion_fairseq.registry import register_criterion

NAME = "label_smoothed_cross_entropy_with_layer_diversity"
DIVERSITY_SIDES = ("both", "encoder", "decoder")
DIVERSITY_COMBINATIONS = ("sum", "mean")
STATES = {"encoder": "encoder_states", "decoder": "inner_states"}  # where the model returns each stack


@dataclass
class LabelSmoothedCrossEntropyWithLayerDiversityConfig(LabelSmoothedCrossEntropyCriterionConfig):
    diversity_lambda: float = field(default=1.0, metadata={
        "help": "weight lambda of the layer-diversity reward (Dou et al. 2018, Eq. 9; "
                "loss = label-smoothed NLL - lambda * diversity); must be >= 0"})
    diversity_sides: ChoiceEnum(DIVERSITY_SIDES) = field(default="both", metadata={
        "help": "layer stacks whose diversity (Eq. 10) is rewarded; with both, the encoder's and the "
                "decoder's terms are combined by --diversity-combine"})
    diversity_combine: ChoiceEnum(DIVERSITY_COMBINATIONS) = field(default="sum", metadata={
        "help": "how the sides' Eq. 10 terms combine: sum (each side weighs lambda) or mean (the two share lambda)"})


@register_criterion(NAME, dataclass=LabelSmoothedCrossEntropyWithLayerDiversityConfig)
class LabelSmoothedCrossEntropyWithLayerDiversityCriterion(LabelSmoothedCrossEntropyCriterion):
    """``label_smoothed_cross_entropy`` minus ``lambda * L_div * sample_size`` (module docstring)."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 diversity_lambda=1.0, diversity_sides="both", diversity_combine="sum"):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        diversity_lambda = float(diversity_lambda)
        if not math.isfinite(diversity_lambda) or diversity_lambda < 0:
            raise ConfigurationError(f"--diversity-lambda must be a finite number >= 0 (the weight of a diversity "
                                     f"reward, Dou et al. 2018 Eq. 9), got {diversity_lambda}")
        for flag, value, allowed in (("--diversity-sides", diversity_sides, DIVERSITY_SIDES),
                                     ("--diversity-combine", diversity_combine, DIVERSITY_COMBINATIONS)):
            if str(value) not in allowed:
                raise ConfigurationError(f"{flag} must be one of {allowed}, got {str(value)!r}")
        self.diversity_lambda = diversity_lambda
        self.diversity_sides = str(diversity_sides)
        self.diversity_combine = str(diversity_combine)
        self.diversity: Tuple[Tensor, Dict[str, Tensor]] = ()  # of the latest compute_loss

    def forward(self, model, sample, reduce=True):
        """fairseq's forward, with L_div in the logs summed over the batch like the loss."""
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        diversity, per_side = self.diversity
        logging_output["layer_diversity"] = diversity.data * sample_size
        for side, value in per_side.items():
            logging_output[f"layer_diversity_{side}"] = value.data * sample_size
        return loss, sample_size, logging_output

    def compute_loss(self, model, net_output, sample, reduce=True):
        loss, nll_loss = super().compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.diversity_lambda > 0):
            self.diversity = self.compute_diversity(net_output, sample)
        if reduce and self.diversity_lambda > 0:
            loss = loss - self.diversity_lambda * sample_size * self.diversity[0].to(loss.dtype)
        return loss, nll_loss

    def compute_diversity(self, net_output, sample) -> Tuple[Tensor, Dict[str, Tensor]]:
        """L_div of the selected sides combined, and each side's Eq. 10 (float32 scalars)."""
        target = sample["target"]
        weights = (torch.ones(target.size(0), device=target.device) if self.sentence_avg
                   else target.ne(self.padding_idx).sum(dim=1))  # each sentence's share of sample_size
        per_side = {side: layer_diversity(states[1:], padding_mask, weights)  # without the embedding output h0
                    for side, (states, padding_mask) in self.layer_states(net_output, sample).items()
                    if len(states[1:]) >= 2}  # a side with fewer than 2 layers is skipped
        if not per_side:
            if self.diversity_lambda > 0:
                raise ConfigurationError(
                    f"--criterion {NAME}: no selected layer stack (--diversity-sides {self.diversity_sides}) "
                    "has 2 or more layers, so there is no layer diversity to reward; use more layers "
                    "or --criterion label_smoothed_cross_entropy")
            return net_output[0].new_zeros((), dtype=torch.float32), per_side
        terms = torch.stack(list(per_side.values()))
        return (terms.sum() if self.diversity_combine == "sum" else terms.mean()), per_side

    def layer_states(self, net_output, sample) -> Dict[str, Tuple[list, Optional[Tensor]]]:
        """``{side: ([h0, h1, ..., hL], padding mask batch x time or None)}`` for the selected sides."""
        extra = net_output[1] if isinstance(net_output, (tuple, list)) and len(net_output) > 1 else None
        sides = ("encoder", "decoder") if self.diversity_sides == "both" else (self.diversity_sides,)
        if not isinstance(extra, dict) or any(STATES[side] not in extra for side in sides):
            raise ConfigurationError(
                f"--criterion {NAME} needs the model's layer states in its output "
                f"(extra[{', '.join(repr(STATES[side]) for side in sides)}]), which this model does not return; "
                "use --arch fusion_transformer or one of its presets (e.g. deeprep_transformer_wmt_en_de)")
        result = {}
        for side in sides:
            states = extra[STATES[side]]
            if states is None or len(states) == 0 or any(state is None for state in states):
                raise ConfigurationError(
                    f"--criterion {NAME}: the model returned no {side} layer states "
                    f"(extra[{STATES[side]!r}] is empty); it must be run with return_all_hiddens=True")
            padding_mask = ((extra.get("encoder_padding_mask") or [None])[0] if side == "encoder"
                            else sample["target"].eq(self.padding_idx))
            result[side] = (list(states), padding_mask)
        return result

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in ("layer_diversity", "layer_diversity_encoder", "layer_diversity_decoder"):
            if sample_size > 0 and any(key in log for log in logging_outputs):
                metrics.log_scalar(key, sum(log.get(key, 0) for log in logging_outputs) / sample_size, sample_size,
                                   round=4)
