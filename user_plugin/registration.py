"""Everything the plugin registers with fairseq and torch, done once, on import.

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

``--user-dir user_plugin`` gets here through ``tasks/load_plugin``, which fairseq's loader
imports in every entry point and every spawned process before any checkpoint is read. Python
code that loads checkpoints or builds models without a fairseq command line imports this module
(the hub and the scripts do).
"""

from . import fairseq_patches
from .safe_loading import allow_fairseq_checkpoint_globals

allow_fairseq_checkpoint_globals()
try:
    fairseq_patches.install()
except fairseq_patches.PatchSwitchError as error:  # a misspelt switch: one line, not a traceback
    raise SystemExit(f"error: {error}") from None

# Registration happens on import; safe loading must be allowed first, hence the late imports.
from . import criterions, lr_schedulers, models  # noqa: E402,F401,I001
from .criterions import label_smoothed_cross_entropy  # noqa: E402,F401
from .lr_schedulers import inverse_sqrt_warmup  # noqa: E402,F401
from .optimizers import multi_tensor_adam  # noqa: E402,F401
from .tasks import vaswani_translation  # noqa: E402,F401
