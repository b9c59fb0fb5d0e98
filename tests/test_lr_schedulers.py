"""The plugin's learning-rate schedulers: DenseNMT's shrink on a rise of the validation loss."""

import re
import pytest

from fairseq.optim import FairseqOptimizer
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY

from conftest import run_cli, USER_DIR
from fusion_fairseq.lr_schedulers.shrink_on_validation_increase import (
    ShrinkOnValidationIncrease, ShrinkOnValidationIncreaseConfig)


class FakeOptimizer(FairseqOptimizer):
    def __init__(self):  # noqa: super() wants a configuration the scheduler never reads
        self.lr = None

    def set_lr(self, lr):
        self.lr = lr

    def get_lr(self):
        return self.lr


def rates(losses, every_epoch_after_increase=False, lr=1.0, maximize=False):
    scheduler = ShrinkOnValidationIncrease(
        ShrinkOnValidationIncreaseConfig(lr_shrink=0.1, shrink_every_epoch_after_increase=every_epoch_after_increase,
                                         lr=[lr], validate_interval=1, disable_validation=False,
                                         maximize_best_checkpoint_metric=maximize),
        FakeOptimizer())
    return [round(scheduler.step(epoch, loss), 10) for epoch, loss in enumerate(losses, 1)]


def test_registered():
    assert LR_SCHEDULER_REGISTRY["shrink_on_validation_increase"] is ShrinkOnValidationIncrease


def test_shrinks_when_the_loss_rises_above_the_previous_epochs():
    # 3.0 after 2.5 is a rise; 2.8 after 3.0 is none although it is worse than the best (2.5), where
    # reduce_lr_on_plateau would shrink
    assert rates([4.0, 3.0, 2.5, 3.0, 2.8, 2.9, 2.0]) == [1.0, 1.0, 1.0, 0.1, 0.1, 0.01, 0.01]


def test_a_metric_to_maximise_shrinks_when_it_falls():
    """--best-checkpoint-metric bleu --maximize-best-checkpoint-metric: the value fairseq passes is BLEU."""
    assert rates([20.0, 22.0, 21.5, 23.0, 22.9], maximize=True) == [1.0, 1.0, 0.1, 0.1, 0.01]


def test_every_epoch_after_the_first_rise():
    assert rates([4.0, 3.0, 3.1, 2.0, 1.9, 1.8], every_epoch_after_increase=True) == [1.0, 1.0, 0.1, 0.01, 0.001, 0.0001]


def test_state_survives_a_checkpoint():
    config = ShrinkOnValidationIncreaseConfig(lr_shrink=0.1, shrink_every_epoch_after_increase=True, lr=[1.0],
                                              validate_interval=1, disable_validation=False,
                                              maximize_best_checkpoint_metric=False)
    first = ShrinkOnValidationIncrease(config, FakeOptimizer())
    for epoch, loss in enumerate([3.0, 3.5], 1):
        first.step(epoch, loss)
    resumed = ShrinkOnValidationIncrease(config, FakeOptimizer())
    resumed.load_state_dict(first.state_dict())
    assert resumed.optimizer.get_lr() == pytest.approx(0.1)
    assert resumed.step(3, 3.4) == pytest.approx(0.01)  # after the first rise: every epoch


@pytest.mark.parametrize("shrink,lrs,message", [(1.5, [0.25], "--lr-shrink must be in (0, 1), got 1.5"),
                                                (0.1, [0.25, 0.1], "takes one learning rate, got 2")])
def test_bad_values_are_refused(shrink, lrs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ShrinkOnValidationIncrease(ShrinkOnValidationIncreaseConfig(lr_shrink=shrink, lr=lrs), FakeOptimizer())


@pytest.mark.slow
def test_fairseq_train_runs_it_and_stops_below_the_minimum(tiny_data_bin, tmp_path):
    """Through fairseq-train: NAG at a rate of 2 makes the validation loss rise after the second epoch;
    from then on the rate shrinks at every epoch end (2, 2, 0.2, 0.02, ...) until it is below
    --stop-min-lr, where fairseq stops."""
    result = run_cli(
        "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "dense_fconv_iwslt_de_en",
        "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--decoder-out-embed-dim", "16",
        "--encoder-layers", "[(8, 3)] * 2", "--decoder-layers", "[(8, 3)] * 2",
        "--optimizer", "nag", "--lr", "2", "--lr-scheduler", "shrink_on_validation_increase",
        "--shrink-every-epoch-after-increase", "--stop-min-lr", "1e-4", "--max-epoch", "15",
        "--batch-size", "300", "--save-dir", tmp_path, "--no-save", "--cpu", "--log-format", "simple")
    log = result.stdout + result.stderr
    epochs = re.findall(r"\| train \| epoch (\d+) \|.*? \| lr ([0-9.e-]+) \|", log)
    assert [float(lr) for _, lr in epochs][:4] == pytest.approx([2, 2, 0.2, 0.02])
    assert "stopping training because current learning rate" in log and len(epochs) < 15


@pytest.mark.parametrize("every_epoch, refused", [(True, True), (False, False)])
def test_every_epoch_shrinking_needs_a_validation_at_every_epoch(every_epoch, refused):
    """With --validate-interval 2, fairseq passes no loss at the epochs it does not validate, as it does when a
    checkpoint is loaded: the every-epoch shrink skipped those epochs without a word."""
    config = ShrinkOnValidationIncreaseConfig(shrink_every_epoch_after_increase=every_epoch, lr=[1.0], validate_interval=2,
                                              disable_validation=False)
    if not refused:
        ShrinkOnValidationIncrease(config, FakeOptimizer())
        return
    with pytest.raises(ValueError, match=r"^--validate-interval 2: --shrink-every-epoch-after-increase shrinks at "
                                         r"every epoch end, .*: it must be 1$"):
        ShrinkOnValidationIncrease(config, FakeOptimizer())


def test_the_validation_interval_reaches_the_scheduler_from_the_command_line():
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--user-dir", USER_DIR, "--arch", "dense_fconv_iwslt_de_en", "--optimizer", "nag",
        "--lr-scheduler", "shrink_on_validation_increase", "--shrink-every-epoch-after-increase",
        "--validate-interval", "3"])
    assert convert_namespace_to_omegaconf(args).lr_scheduler.validate_interval == 3


def test_without_validation_it_is_refused(tmp_path):
    """It never changed the rate under --disable-validation, which fairseq-train accepted in silence."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--user-dir", USER_DIR, "--arch", "dense_fconv_iwslt_de_en", "--optimizer", "nag", "--lr", "0.25",
        "--lr-scheduler", "shrink_on_validation_increase", "--disable-validation"])
    with pytest.raises(ValueError, match=r"^--disable-validation: shrink_on_validation_increase shrinks the rate "
                                         r"when the validation loss rises, .*--lr-scheduler fixed$"):
        ShrinkOnValidationIncrease(convert_namespace_to_omegaconf(args).lr_scheduler, FakeOptimizer())
