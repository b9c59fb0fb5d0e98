"""fairseq's registration decorators, whose refusal of a name already taken names both definitions (fairseq's
own say only "Cannot register duplicate criterion (NAME)", and ``register_model`` silently hands back the
model registered first).

The plugin is loaded once, as ``fusion_fairseq`` (its ``__init__`` refuses a second copy or a second module
name), so a taken name is always a clash: with another plugin, or with fairseq itself.
"""

import inspect

from fairseq.criterions import CRITERION_REGISTRY, register_criterion as _fairseq_register_criterion
from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_REGISTRY
from fairseq.models import register_model as _fairseq_register_model
from fairseq.models import register_model_architecture as _fairseq_register_architecture
from fairseq.optim import OPTIMIZER_REGISTRY, register_optimizer as _fairseq_register_optimizer
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.optim.lr_scheduler import register_lr_scheduler as _fairseq_register_lr_scheduler


def definition(obj) -> str:
    """``module.name (file:line)`` of a class or function."""
    try:
        where = f" ({inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]})"
    except (OSError, TypeError):
        where = ""
    return f"{obj.__module__}.{obj.__qualname__}{where}"


def clash(kind, name, existing, candidate) -> ValueError:
    return ValueError(f"Cannot register duplicate {kind} ({name}): {definition(candidate)} would replace "
                      f"{definition(existing)}, registered first")


def _refusing_clashes(registry, register, kind):
    def decorator(name, **kwargs):
        def wrapper(cls):
            if name in registry:
                raise clash(kind, name, registry[name], cls)
            return register(name, **kwargs)(cls)
        return wrapper
    return decorator


register_model = _refusing_clashes(MODEL_REGISTRY, _fairseq_register_model, "model")
register_criterion = _refusing_clashes(CRITERION_REGISTRY, _fairseq_register_criterion, "criterion")
register_lr_scheduler = _refusing_clashes(LR_SCHEDULER_REGISTRY, _fairseq_register_lr_scheduler, "lr_scheduler")
register_optimizer = _refusing_clashes(OPTIMIZER_REGISTRY, _fairseq_register_optimizer, "optimizer")


def register_model_architecture(model_name, arch_name):
    def wrapper(fn):
        existing = ARCH_CONFIG_REGISTRY.get(arch_name)
        if arch_name == model_name and getattr(existing, "__module__", None) == "fairseq.models":
            # register_model(name, dataclass=...) gave the model's own name a no-op architecture; the
            # plugin's base architecture (fairseq's defaults, then the derived ones) takes its place
            ARCH_CONFIG_REGISTRY[arch_name] = fn
            return fn
        if existing is not None:
            raise clash("model architecture", arch_name, existing, fn)
        return _fairseq_register_architecture(model_name, arch_name)(fn)

    return wrapper
