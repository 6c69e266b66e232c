"""Tasks of the plugin. fairseq imports every module here when it loads ``--user-dir``; this
package's import registers the whole plugin (:mod:`user_plugin.registration`)."""

from .. import registration  # noqa: F401  (the criterion, scheduler, models, safe loading)
from .vaswani_translation import VaswaniTranslationTask  # noqa: F401  (registers the task)
