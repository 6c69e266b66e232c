"""vaswani: the Transformer of *Attention Is All You Need* as a fairseq plugin.

``fairseq-train --user-dir user_plugin --arch vaswani_base ...`` loads this package; fairseq's
loader then imports ``tasks/`` and ``models/``, and through them :mod:`.registration` registers
the model, its architectures, the criterion, the LR scheduler and the task, and makes
checkpoints load under torch's safe loading.

Importing the package itself is cheap (no torch, no fairseq), so that the plain file helpers of
:mod:`.files` and the paper's settings (:mod:`.paper`) serve scripts quickly. From Python,
``user_plugin.registration.register()`` registers everything (an explicit, idempotent call);
:mod:`.hub`, the commands and the scripts make it.

Where each part of the paper lives: ``modules/`` (§3.2 attention, §3.3 feed-forward, §3.5
positions, the residual wrapping of §3.1, beam-search state and caches), ``models/`` (§3.1
stacks, §3.4 embeddings, Table 3 architectures), ``criterions/`` (§5.4), ``lr_schedulers/``
(§5.3), ``tasks/`` and ``generation/`` (§6.1), ``paper.py`` (the paper's numbers).
"""
