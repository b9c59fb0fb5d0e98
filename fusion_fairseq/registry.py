"""fairseq's registration decorators, tolerating the plugin imported twice.

``--user-dir`` imports this package by its directory name, and a user may also ``import fusion_fairseq``
in the same process: one file executed under two module names, where fairseq's decorators raise "Cannot
register duplicate model". A name taken by the same definition (same qualified name and module path
inside the package) is skipped; a clash with somebody else's raises.
"""

from fairseq.criterions import CRITERION_REGISTRY, register_criterion as _fairseq_register_criterion
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY
from fairseq.models import register_model as _fairseq_register_model
from fairseq.models import register_model_architecture as _fairseq_register_architecture
from fairseq.optim import OPTIMIZER_REGISTRY, register_optimizer as _fairseq_register_optimizer
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.optim.lr_scheduler import register_lr_scheduler as _fairseq_register_lr_scheduler


def same_definition(registered, candidate):
    inside_package = [obj.__module__.split(".", 1)[-1] for obj in (registered, candidate)]  # models.foo
    return registered is candidate or (registered.__qualname__ == candidate.__qualname__
                                       and inside_package[0] == inside_package[1])


def _tolerant(registry, register, kind):
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
register_optimizer = _tolerant(OPTIMIZER_REGISTRY, _fairseq_register_optimizer, "optimizer")


def register_model_architecture(model_name, arch_name):
    def wrapper(fn):
        existing = ARCH_CONFIG_REGISTRY.get(arch_name)
        if existing is not None and ARCH_MODEL_NAME_REGISTRY.get(arch_name) == model_name \
                and same_definition(existing, fn):
            return existing
        if arch_name == model_name and getattr(existing, "__module__", None) == "fairseq.models":
            # register_model(name, dataclass=...) gave the model's own name a no-op architecture; the
            # plugin's base architecture (fairseq's defaults, then the derived ones) takes its place
            ARCH_CONFIG_REGISTRY[arch_name] = fn
            return fn
        return _fairseq_register_architecture(model_name, arch_name)(fn)

    return wrapper
