"""Tasks of the plugin. fairseq imports every module here when it loads ``--user-dir``."""

from .vaswani_translation import VaswaniTranslationTask  # noqa: F401  (registers the task)
