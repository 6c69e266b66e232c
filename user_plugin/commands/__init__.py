"""The project's command-line tools, one module per installed command.

``pip install .`` (or ``-e .``) puts each on ``PATH`` as a console script named in fairseq's
``fairseq-*`` style (``setup.py``'s ``entry_points``); every module here has a ``cli_main()``
that the console script calls and a ``main(argv)`` that returns the exit status, for use from
Python. The package is called ``commands`` because that is what it holds: the programs a user
types, as opposed to the library code (models, data, files) they are built on. fairseq's
``--user-dir`` loader imports only ``tasks/`` and ``models/``, so nothing here is loaded into a
training run.

=========================  ================================================================
command                    module
=========================  ================================================================
``vaswani-user-dir``       :mod:`.user_dir`: prints the ``--user-dir`` path
``vaswani-options``        :mod:`.model_options`: the plugin's model/criterion/task options
``vaswani-prepare-text``   :mod:`.prepare_text`: Moses text preparation, SentencePiece (§5.1)
``vaswani-average``        :mod:`.average_checkpoints`: checkpoint averaging (§6.1)
``vaswani-score``          :mod:`.score_translation`: tokenized BLEU and sacreBLEU (Table 2)
``vaswani-plot-training``  :mod:`.plot_training`: training curves from fairseq-train logs
``vaswani-plot-attention`` :mod:`.plot_attention`: attention heatmaps (Figures 3-5)
``vaswani-ablation-table`` :mod:`.ablation_table`: Table 3 from ``recipes/ablation.sh``
``vaswani-prepare-trees``  :mod:`.prepare_trees`: Penn Treebank preparation (§6.3)
``vaswani-parse-eval``     :mod:`.parse_eval`: EVALB-compatible bracket scoring (§6.3)
``vaswani-step``           :mod:`.recipe_step`: the recipes' step engine (records, restarts)
``vaswani-export``         :mod:`.export`: fairseq / CTranslate2 / transformers exports
``vaswani-package``        :mod:`.package`: a model package of checkpoints, or its check
``vaswani-translate``      :mod:`.translate`: translate stdin with a model dir
``vaswani-serve``          :mod:`.serve`: an HTTP translation service (dynamic batching)
=========================  ================================================================

Importing the package installs the one-line exception hook, row ``one_line_errors`` of the
plugin's patch table (under its switch, ``VASWANI_FAIRSEQ_PATCHES=off:one_line_errors``), and
only that row, so that an interrupt (Ctrl-C) or an error while a command is still loading its
libraries (torch and fairseq take seconds) is one line too, as it is once the command runs
(:func:`~user_plugin.files.errors.run_main`).
"""

from .. import fairseq_patches

fairseq_patches.install(only=lambda patch: patch.name == fairseq_patches.ONE_LINE_ERRORS)
