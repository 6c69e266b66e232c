"""Everything the plugin registers with fairseq and torch: one explicit, idempotent call,
:func:`register`, made by the entry points.

* model ``vaswani_transformer`` and its architectures (``models/``, §3, Table 3);
* criterion ``vaswani_label_smoothed_cross_entropy`` (``criterions/``, §5.4);
* LR scheduler ``vaswani_inverse_sqrt`` (``lr_schedulers/``, §5.3);
* optimizer ``vaswani_adam``, Adam as multi-tensor operations (``optimizers/``, §5.3);
* task ``vaswani_translation`` with the paper's beam search settings (``tasks/``, §6.1);
* the types of fairseq checkpoints, allow-listed for torch's safe loading (``safe_loading``);
* the plugin's patches of fairseq, from one table (``fairseq_patches``; ``python -m
  user_plugin.fairseq_patches`` lists them, ``VASWANI_FAIRSEQ_PATCHES=off`` turns them off):
  atomic checkpoint copies, the training run's save directory (one writer, final means final,
  verified and intact resumes, one-line save errors), ``--bf16`` as autocast, a progress line,
  fixes of fairseq's decoding bugs, one-line errors.

The entry points call it: ``--user-dir user_plugin`` through ``tasks/load_plugin`` (which
fairseq's loader imports in every entry point and every spawned process before any checkpoint
is read), the hub's :func:`~user_plugin.hub.loader.load_translator`, the commands that open
models, and Python code that trains or decodes without a fairseq command line. Library layers
never call it: importing them changes nothing in fairseq.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register the plugin (see the module docstring); a second call does nothing. A misspelt
    ``VASWANI_FAIRSEQ_PATCHES`` ends the process with one error line."""
    global _registered
    if _registered:
        return
    from . import fairseq_patches
    from .safe_loading import allow_fairseq_checkpoint_globals

    # safe loading is allowed first: the registering imports may read checkpoints' types
    allow_fairseq_checkpoint_globals()
    try:
        fairseq_patches.install()
    except fairseq_patches.PatchSwitchError as error:  # a misspelt switch: one line
        raise SystemExit(f"error: {error}") from None
    from . import criterions, lr_schedulers, models  # noqa: F401
    from .criterions import label_smoothed_cross_entropy  # noqa: F401
    from .lr_schedulers import inverse_sqrt_warmup  # noqa: F401
    from .optimizers import multi_tensor_adam  # noqa: F401
    from .tasks import vaswani_translation  # noqa: F401

    _registered = True
