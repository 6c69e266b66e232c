"""Which fairseq runs the plugin's changes of training semantics apply to.

Loading the plugin (``--user-dir``) replaces attributes of fairseq in the whole process. A row
that changes what a run computes or writes (its precision, its checkpoints) must leave a stock
run alone, for example ``--arch transformer --task translation`` that loads the plugin only for
its scheduler or criterion: such a run behaves as stock fairseq. :func:`is_our_run` is the one
test of that, shared by every such row.
"""

from __future__ import annotations

from typing import Any, Optional


def _section(cfg: Any, name: str) -> Any:
    """``cfg.name`` of an omegaconf configuration, or None (a Namespace has no sections)."""
    try:
        return cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)
    except Exception:  # omegaconf's missing-value errors: no such section
        return None


def _selected_name(cfg: Any, section: str, legacy: str) -> Optional[str]:
    """The name chosen for ``section`` ("model", "task"): ``cfg.section._name`` of an omegaconf
    configuration, or the Namespace attribute ``legacy`` (``arch``, ``task``)."""
    part = _section(cfg, section)
    if part is not None and not isinstance(part, str):
        name = _section(part, "_name")
        if name:
            return str(name)
    value = getattr(cfg, legacy, None)
    return value if isinstance(value, str) else None


def is_our_run(cfg: Any) -> bool:
    """Whether a fairseq configuration (omegaconf or argparse Namespace) trains the plugin's
    model (any architecture of ``vaswani_transformer`` or of a model class derived from it) or
    runs the plugin's task (``vaswani_translation`` or a task derived from it)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    from ..models.vaswani_transformer import VaswaniTransformerModel
    from ..tasks.vaswani_translation import VaswaniTranslationTask

    arch = _selected_name(cfg, "model", "arch")
    model = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch) if arch else None
    if isinstance(model, type) and issubclass(model, VaswaniTransformerModel):
        return True
    task_name = _selected_name(cfg, "task", "task")
    task = TASK_REGISTRY.get(task_name) if task_name else None
    return isinstance(task, type) and issubclass(task, VaswaniTranslationTask)
