"""fairseq's Adam with per-parameter overrides (``--optimizer adam_with_overrides``).

fairseq's trainer hands its optimizer one flat list of parameters, so ``--optimizer adam`` decays every
parameter alike. fairseq's convention for a parameter that needs other settings is an ``optim_overrides``
attribute, but only its ``composite`` optimizer reads it, and takes a learning-rate scale from it, never a
weight decay. This optimizer reads ``{"optimizer": {"weight_decay": 0.0}}`` from the same attribute, with
nothing to configure: each distinct override becomes a
parameter group of fairseq's own Adam, and every parameter without one is optimised exactly as
``--optimizer adam`` would (same flags, same update). Hyper-connections mark their static weights this
way (Zhu et al. 2025, Sec. 4: no weight decay on the static components).

Under ``--fp16`` (not ``--bf16``) fairseq flattens every parameter into one tensor before the optimizer sees
them, which erases the attribute: pass ``--fp16-no-flatten-grads`` there.
"""

from dataclasses import dataclass
from typing import Dict, List

from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.registry import register_optimizer

OVERRIDABLE = ("weight_decay",)


@dataclass
class AdamWithOverridesConfig(FairseqAdamConfig):
    pass


def override_of(parameter) -> Dict[str, float]:
    """The optimizer settings a parameter overrides (fairseq's ``optim_overrides["optimizer"]``)."""
    overrides = dict(getattr(parameter, "optim_overrides", None) or {}).get("optimizer", {})
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise ConfigurationError(f"--optimizer adam_with_overrides: a parameter overrides {', '.join(unknown)}; "
                                 f"allowed: {', '.join(OVERRIDABLE)}")
    return dict(overrides)


def parameter_groups(params) -> List[dict]:
    """One group per distinct override, the parameters without any first and in their order."""
    groups: Dict[tuple, dict] = {(): {"params": []}}
    for parameter in params:
        override = override_of(parameter)
        key = tuple(sorted(override.items()))
        groups.setdefault(key, {"params": [], **override})["params"].append(parameter)
    return [group for group in groups.values() if group["params"]]


@register_optimizer("adam_with_overrides", dataclass=AdamWithOverridesConfig)
class AdamWithOverrides(FairseqAdam):
    """fairseq's Adam; parameters carrying ``optim_overrides`` form groups with their own settings."""

    def __init__(self, cfg: AdamWithOverridesConfig, params):
        groups = parameter_groups(params)
        self.group_overrides = [{key: value for key, value in group.items() if key != "params"} for group in groups]
        super().__init__(cfg, groups)

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        """fairseq's, then each group's own overrides again: ``--optimizer-overrides`` changes every
        group, but a parameter's own override stands. A state of other groups is refused in one line."""
        stored, groups = len(state_dict["param_groups"]), len(self.group_overrides)
        if stored != groups:
            raise ConfigurationError(
                f"--optimizer adam_with_overrides: the checkpoint's optimizer state has {stored} parameter group(s), "
                f"this model's parameters form {groups} (a flag that gives parameters their own settings differs "
                "from the run's, e.g. --hyper-connections-decay-static); pass --reset-optimizer to start Adam afresh")
        super().load_state_dict(state_dict, optimizer_overrides)
        for group, overrides in zip(self.param_groups, self.group_overrides):
            group.update(overrides)
