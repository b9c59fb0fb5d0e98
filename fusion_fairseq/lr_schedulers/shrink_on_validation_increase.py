"""The learning-rate schedule of DenseNMT (Shen et al., NAACL 2018, Sec. 4.3), after ConvS2S.

Paper: "For German-English and Turkish-English experiments, the learning rate will shrink by 10 every
time the validation loss increases. For the English-German dataset, in consistent with (Gehring et
al., 2017), the learning rate will shrink by 10 every epoch since the first increment of validation
loss. The system stops training until the learning rate is less than 10^-4."

Reading: "increases" compares an epoch's validation loss with the previous epoch's (fairseq's
``reduce_lr_on_plateau`` compares it with the best one, so it also shrinks after an epoch that is
merely no better than the best). With ``--shrink-every-epoch-after-increase`` (En-De) the first
increase shrinks the rate and so does every epoch end after it, whatever the loss does. Stopping
below 1e-4 is fairseq's ``--stop-min-lr 1e-4``. fairseq hands the scheduler its ``--best-checkpoint-metric``
(the loss by default); under ``--maximize-best-checkpoint-metric`` (e.g. BLEU) a fall is what gets worse.

fairseq tells the scheduler of an epoch's end and its validation loss together, and with no loss both
after an epoch it did not validate (``--validate-interval`` above 1) and as a checkpoint is loaded: so
the every-epoch shrink needs a validation at every epoch (``--validate-interval 1``, refused otherwise).
An epoch's end checkpoint is saved before that epoch's step, so a training resumed from it does not
apply that epoch's shrink, as with fairseq's ``reduce_lr_on_plateau``.
"""

from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler
from omegaconf import II

from fusion_fairseq.registry import register_lr_scheduler
from fusion_fairseq.errors import ConfigurationError


@dataclass
class ShrinkOnValidationIncreaseConfig(FairseqDataclass):
    lr_shrink: float = field(default=0.1, metadata={"help": "factor the learning rate is multiplied by (paper: 1/10)"})
    shrink_every_epoch_after_increase: bool = field(
        default=False, metadata={"help": "after the first increase, shrink at every epoch end (Shen et al.'s En-De)"})
    lr: List[float] = II("optimization.lr")
    validate_interval: int = II("dataset.validate_interval")
    disable_validation: bool = II("dataset.disable_validation")
    maximize_best_checkpoint_metric: bool = II("checkpoint.maximize_best_checkpoint_metric")


@register_lr_scheduler("shrink_on_validation_increase", dataclass=ShrinkOnValidationIncreaseConfig)
class ShrinkOnValidationIncrease(FairseqLRScheduler):
    """A constant rate, multiplied by ``--lr-shrink`` at the end of an epoch whose validation loss is
    worse than the previous epoch's (and, with ``--shrink-every-epoch-after-increase``, at every epoch end
    after the first such epoch)."""

    def __init__(self, cfg: ShrinkOnValidationIncreaseConfig, optimizer):
        super().__init__(cfg, optimizer)
        if not 0 < cfg.lr_shrink < 1:
            raise ConfigurationError(f"--lr-shrink must be in (0, 1), got {cfg.lr_shrink}")
        if len(cfg.lr) != 1:
            raise ConfigurationError(f"--lr: shrink_on_validation_increase takes one learning rate, got {len(cfg.lr)}")
        if cfg.disable_validation:
            raise ConfigurationError("--disable-validation: shrink_on_validation_increase shrinks the rate when the "
                                     "validation loss rises, so without validation it never would; validate, or use "
                                     "--lr-scheduler fixed")
        if cfg.shrink_every_epoch_after_increase and cfg.validate_interval != 1:
            raise ConfigurationError(
                f"--validate-interval {cfg.validate_interval}: --shrink-every-epoch-after-increase shrinks at every "
                "epoch end, which fairseq reports to the scheduler only with a validation: it must be 1")
        self.lr = cfg.lr[0]
        self.previous_loss = None
        self.increased = False
        self.optimizer.set_lr(self.lr)

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)
        if val_loss is not None:  # the value of --best-checkpoint-metric
            maximize, previous = self.cfg.maximize_best_checkpoint_metric, self.previous_loss
            worse = previous is not None and (val_loss < previous if maximize else val_loss > previous)
            self.increased = self.increased or worse
            if worse or (self.increased and self.cfg.shrink_every_epoch_after_increase):
                self.lr *= self.cfg.lr_shrink
            self.previous_loss = val_loss
        self.optimizer.set_lr(self.lr)
        return self.lr

    def state_dict(self):
        return {**super().state_dict(), "lr": self.lr, "previous_loss": self.previous_loss, "increased": self.increased}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.lr = state_dict["lr"]
        self.previous_loss = state_dict["previous_loss"]
        self.increased = state_dict["increased"]
        self.optimizer.set_lr(self.lr)
