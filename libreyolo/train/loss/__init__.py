"""Training losses and how the trainer finds a family's.

The trainer asks :func:`loss_for` for a family's loss and never branches on family names: the
family declares it, as ``training = "module:attr"`` on its :class:`~libreyolo.models.base.Family`
adapter (yolo9: :class:`~libreyolo.train.loss.yolo9.DetectionLoss`; the classifiers:
:class:`~libreyolo.train.loss.classify.ClassificationLoss`). A loss is a callable built as
``factory(nc=..., **hyp)``; it is called on the network's training outputs and the batch's
targets and returns ``(loss, items)``, the items named by the family's ``training_items``.
"""
from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from libreyolo.errors import LibreYOLOError

__all__ = ["loss_for"]

logger = logging.getLogger("libreyolo")



def loss_for(family_name: str, task: str, nc: int, **hyp: Any) -> Callable[..., Any]:
    """The training loss of a family, built for ``nc`` classes.

    ``hyp`` may hold the trainer's whole hyperparameter set: only the keywords the loss accepts
    are passed on (the others are logged at debug level), so one dict serves every family.
    Raises :class:`LibreYOLOError` when no loss is known for the family and task.
    """
    spec = _declared_spec(family_name)
    if spec is None:
        from libreyolo.models.registry import families

        trainable = sorted(name for name, fam in families().items() if getattr(fam, "training", None))
        raise LibreYOLOError(
            f"training for family {family_name!r} (task {task!r}) is not available yet; "
            f"trainable now: {', '.join(trainable)}. Fine-tune one of those, or use this family for inference/export"
        )
    from libreyolo.models.registry import families

    family = families().get(family_name)
    own = family.loss_kwargs(nc) if family is not None else {}
    return _build(_resolve(spec), nc, hyp, own)


def _declared_spec(family_name: str) -> str | None:
    """The ``"module:attr"`` a registered family declares through ``Family.training``, if any."""
    from libreyolo.models.registry import families

    family = families().get(family_name)
    training = getattr(family, "training", None)
    spec = training if isinstance(training, str) or training is None else getattr(training, "loss", None)
    return spec or None


def _resolve(spec: str) -> Callable[..., Any]:
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise LibreYOLOError(f"training loss {spec!r} cannot be loaded ({exc}); expected 'package.module:attribute'") \
            from exc


def _build(factory: Callable[..., Any], nc: int, hyp: dict[str, Any],
           own: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``factory(nc=nc, **accepted hyp, **own)``: ``own`` (the family's ``loss_kwargs``) is passed whole."""
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in hyp.items() if takes_any or k in params}
    kwargs.update(own or {})
    ignored = sorted(set(hyp) - set(kwargs))
    if ignored:
        logger.debug("%s ignores hyperparameters %s", getattr(factory, "__name__", factory), ignored)
    if takes_any or "nc" in params:
        kwargs["nc"] = nc
    return factory(**kwargs)
