"""Registration helpers that tolerate the plugin being imported twice.

fairseq's ``--user-dir`` imports this package by its directory name, and a user may also
``import fusion_fairseq`` in the same process (tests, notebooks, an installed copy beside a
checkout). When one file is executed twice under two module names, fairseq's own decorators
raise "Cannot register duplicate model". These wrappers skip a registration when the name is
already taken by a definition of the same name from a file of the same relative path, and
raise for a genuine clash with somebody else's model.
"""

from fairseq.criterions import CRITERION_REGISTRY
from fairseq.criterions import register_criterion as _fairseq_register_criterion
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.optim.lr_scheduler import register_lr_scheduler as _fairseq_register_lr_scheduler
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    MODEL_REGISTRY,
    register_model as _fairseq_register_model,
    register_model_architecture as _fairseq_register_architecture,
)


def _relative_module(obj):
    """``pkg.models.foo`` -> ``models.foo``: the part of the module path inside the package."""
    return obj.__module__.split(".", 1)[-1]


def same_definition(registered, candidate):
    """True when ``registered`` is ``candidate`` or the same source loaded under another name."""
    return registered is candidate or (
        registered.__qualname__ == candidate.__qualname__
        and _relative_module(registered) == _relative_module(candidate)
    )


def _tolerant(registry, register, kind):
    """``register`` (a fairseq decorator factory) that returns the registered class when the name is
    taken by the same definition, and raises for somebody else's (fairseq's main branch silently keeps
    the first model for a taken name, and raises for any second criterion or scheduler)."""
    def decorator(name, **kwargs):
        def wrapper(cls):
            existing = registry.get(name)
            if existing is None:
                return register(name, **kwargs)(cls)
            if same_definition(existing, cls):
                return existing
            raise ValueError(f"Cannot register duplicate {kind} ({name}): already registered by "
                             f"{existing.__module__}.{existing.__qualname__}")
        return wrapper
    return decorator


register_model = _tolerant(MODEL_REGISTRY, _fairseq_register_model, "model")
register_criterion = _tolerant(CRITERION_REGISTRY, _fairseq_register_criterion, "criterion")
register_lr_scheduler = _tolerant(LR_SCHEDULER_REGISTRY, _fairseq_register_lr_scheduler, "lr_scheduler")


def register_model_architecture(model_name, arch_name):
    def wrapper(fn):
        existing = ARCH_CONFIG_REGISTRY.get(arch_name)
        if (
            existing is not None
            and ARCH_MODEL_NAME_REGISTRY.get(arch_name) == model_name
            and same_definition(existing, fn)
        ):
            return existing
        if arch_name == model_name and getattr(existing, "__module__", None) == "fairseq.models":
            # register_model(name, dataclass=...) gave the model's own name a no-op architecture; the
            # plugin's base architecture (fairseq's defaults, then the derived ones) takes its place
            ARCH_CONFIG_REGISTRY[arch_name] = fn
            return fn
        return _fairseq_register_architecture(model_name, arch_name)(fn)

    return wrapper
