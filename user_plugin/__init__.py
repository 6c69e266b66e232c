"""vaswani: the Transformer of *Attention Is All You Need* as a fairseq plugin.

``fairseq-train --user-dir user_plugin --arch vaswani_base ...`` imports this package, which
registers (each module names the paper section it implements):

* model ``vaswani_transformer`` and its architectures (``models/``);
* criterion ``vaswani_label_smoothed_cross_entropy`` (``criterions/``, §5.4);
* LR scheduler ``vaswani_inverse_sqrt`` (``lr_schedulers/``, §5.3);
* task ``vaswani_translation`` with the paper's beam search settings (``tasks/``, §6.1);

allow-lists the types in fairseq checkpoints for torch's safe loading (``safe_loading``), and
makes fairseq's checkpoint copies atomic (``atomic_checkpoint_copy``).
"""

from .atomic_checkpoint_copy import install_atomic_checkpoint_copy
from .safe_loading import allow_fairseq_checkpoint_globals

allow_fairseq_checkpoint_globals()
install_atomic_checkpoint_copy()

# Registration happens on import; safe loading must be allowed first, hence the late imports.
from . import criterions, lr_schedulers, models, tasks  # noqa: E402,F401,I001
from .criterions import label_smoothed_cross_entropy  # noqa: E402,F401
from .lr_schedulers import inverse_sqrt_warmup  # noqa: E402,F401
from .tasks import vaswani_translation  # noqa: E402,F401
