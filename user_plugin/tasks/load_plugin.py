"""What ``--user-dir user_plugin`` runs: the whole plugin's registration.

fairseq's loader imports every module of ``<user dir>/tasks`` (and ``models``) in every entry
point and every spawned process, before any checkpoint is read; importing this one registers
the model, criterion, scheduler and task, allows the types of fairseq checkpoints under torch's
safe loading and installs the plugin's fairseq patches (:mod:`user_plugin.registration`). It is
a module of its own, not the package's ``__init__``, so that the registration can import the
task module without importing itself back.
"""

from ..registration import register

register()
