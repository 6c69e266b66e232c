"""Tasks of the plugin. fairseq imports every module here when it loads ``--user-dir``: the task
itself (:mod:`.vaswani_translation`), and :mod:`.load_plugin`, which registers the whole plugin
(:mod:`user_plugin.registration`)."""
