"""Everything the plugin registers with fairseq and torch, done once, on import.

* model ``vaswani_transformer`` and its architectures (``models/``, §3, Table 3);
* criterion ``vaswani_label_smoothed_cross_entropy`` (``criterions/``, §5.4);
* LR scheduler ``vaswani_inverse_sqrt`` (``lr_schedulers/``, §5.3);
* task ``vaswani_translation`` with the paper's beam search settings (``tasks/``, §6.1);
* the types of fairseq checkpoints, allow-listed for torch's safe loading (``safe_loading``);
* atomic copies of fairseq's ``checkpoint_last.pt`` / ``checkpoint_best.pt``
  (``atomic_checkpoint_copy``);
* fixes of fairseq's decoding bugs: diverse beam search, ``--replace-unk``
  (``generation/fairseq_fixes``);
* fairseq's ``--bf16`` as bfloat16 autocast on CUDA GPUs and CPUs, and float16 loss-scale
  overflows handled on a CPU (``precision``);
* a progress line with the time left after each ``train_inner`` record of fairseq-train
  (``progress``);
* the training run's save directory: one writer, final means final, verified and intact
  resumes, one-line save errors, no orphaned temporary files; every checkpoint fairseq reads is
  verified (``training_run``).

``--user-dir user_plugin`` gets here through ``tasks/__init__``, which fairseq's loader imports in
every entry point and every spawned process before any checkpoint is read. Python code that
loads checkpoints or builds models without a fairseq command line imports this module (the hub
and the scripts do).
"""

from .atomic_checkpoint_copy import install_atomic_checkpoint_copy
from .precision import install_reduced_precision
from .progress import install_progress_reporting
from .safe_loading import allow_fairseq_checkpoint_globals
from .training_run import install_training_run_guards

allow_fairseq_checkpoint_globals()
install_atomic_checkpoint_copy()
install_reduced_precision()
install_progress_reporting()
install_training_run_guards()

# Registration happens on import; safe loading must be allowed first, hence the late imports.
from . import criterions, lr_schedulers, models, tasks  # noqa: E402,F401,I001
from .generation.fairseq_fixes import install_fairseq_decoding_fixes  # noqa: E402
from .criterions import label_smoothed_cross_entropy  # noqa: E402,F401
from .lr_schedulers import inverse_sqrt_warmup  # noqa: E402,F401
from .tasks import vaswani_translation  # noqa: E402,F401

install_fairseq_decoding_fixes()
