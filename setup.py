"""Installs the ``user_plugin`` package (the fairseq ``--user-dir`` of vaswani) and what it needs.

Official fairseq 0.12.2 does not import on Python >= 3.11; the ``fairseq-fixed`` fork (same
import name) does. Install torch first (``pip install torch==2.13.0``): an unpinned torch
pulls a multi-GB CUDA build. ``scripts/setup_venv.sh`` does all of this in ``.venv``.
"""

from setuptools import find_packages, setup

setup(
    name="vaswani",
    version="0.1.0",
    description="The Transformer of 'Attention Is All You Need' as a fairseq plugin",
    packages=find_packages(include=["user_plugin", "user_plugin.*"]),
    # the page of vaswani-serve, served as it is
    package_data={"user_plugin.serving": ["static/*.html", "static/*.js", "static/*.css"]},
    # The tools, as commands on PATH (user_plugin/commands/: one module per command).
    entry_points={
        "console_scripts": [
            "vaswani-user-dir = user_plugin.commands.user_dir:cli_main",
            "vaswani-options = user_plugin.commands.model_options:cli_main",
            "vaswani-prepare-text = user_plugin.commands.prepare_text:cli_main",
            "vaswani-average = user_plugin.commands.average_checkpoints:cli_main",
            "vaswani-score = user_plugin.commands.score_translation:cli_main",
            "vaswani-plot-training = user_plugin.commands.plot_training:cli_main",
            "vaswani-plot-attention = user_plugin.commands.plot_attention:cli_main",
            "vaswani-ablation-table = user_plugin.commands.ablation_table:cli_main",
            "vaswani-prepare-trees = user_plugin.commands.prepare_trees:cli_main",
            "vaswani-parse-eval = user_plugin.commands.parse_eval:cli_main",
            "vaswani-step = user_plugin.commands.recipe_step:cli_main",
            "vaswani-export = user_plugin.commands.export:cli_main",
            "vaswani-package = user_plugin.commands.package:cli_main",
            "vaswani-translate = user_plugin.commands.translate:cli_main",
            "vaswani-serve = user_plugin.commands.serve:cli_main",
        ],
    },
    python_requires=">=3.8",
    install_requires=[
        "torch>=1.13",
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "fairseq==0.12.2; python_version < '3.11'",
        "sacremoses",
        "subword-nmt",
        "sentencepiece",
        "sacrebleu>=2.0",
        # fairseq's --tensorboard-logdir writer (the recipes log to TensorBoard by default);
        # the lighter of the two fairseq can use. Viewing the logs needs `tensorboard`.
        "tensorboardX",
        # training curves drawn by the recipes (vaswani-plot-training)
        "matplotlib",
        "nltk>=3.8",  # tree reading of the parsing recipe (user_plugin/parsing)
        # vaswani-serve (user_plugin/serving): the ASGI toolkit and server, both small and
        # pure Python (Starlette needs anyio; uvicorn needs click and h11)
        "starlette>=0.37,<2",
        "uvicorn>=0.30,<1",
    ],
    extras_require={
        # ctranslate2: vaswani-export --to ctranslate2 and the hub's
        # backend="ctranslate2" (CPU int8 decoding); the tests run them.
        # httpx: Starlette's TestClient and the client of scripts/benchmark_serving.py
        # pytest-xdist: scripts/run_tests.sh runs the suite's files on every core (its
        # processes use one thread each), which halves CI's wall time on 2 cores; 3.8 for
        # --no-loadscope-reorder (the slowest files first, tests/conftest.py)
        "test": ["pytest", "pytest-xdist>=3.8", "hypothesis", "matplotlib", "ruff",
                 "ctranslate2==4.8.5", "transformers>=5,<6", "httpx"],
        "plot": ["matplotlib"],
        "ctranslate2": ["ctranslate2==4.8.5"],
        # transformers: vaswani-export --to transformers (Marian / FSMT)
        "transformers": ["transformers>=5,<6"],
    },
)
