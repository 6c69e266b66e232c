"""custom_ffn: an example ``--user-dir`` that extends vaswani's Transformer (docs/extending.md).

It registers a model ``gated_ffn_transformer``, the paper's Transformer (§3) whose position-wise
feed-forward network (§3.3) is replaced by a gated linear unit (``models/``), and its
architecture ``gated_ffn_base``::

    fairseq-train DATA --user-dir examples/custom_ffn --arch gated_ffn_base ...

fairseq accepts a single ``--user-dir``, so this package loads vaswani's plugin itself, exactly
as ``--user-dir user_plugin`` would (fairseq's ``import_user_module``: the package, then every
module of its ``tasks/`` and ``models/``). The plugin is found where Python finds it (``pip
install -e`` of the repository), or else beside this example in the repository checkout.
fairseq remembers what it imported, so loading the plugin again (a second call, or a checkpoint
whose config names it) registers nothing twice.
"""

import importlib.util
from argparse import Namespace
from pathlib import Path

from fairseq import utils

REPO_ROOT = Path(__file__).resolve().parents[2]


def vaswani_plugin_dir() -> Path:
    """Where vaswani's ``user_plugin`` package is: the importable one, else the checkout's."""
    spec = importlib.util.find_spec("user_plugin")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    candidate = REPO_ROOT / "user_plugin"
    if not (candidate / "__init__.py").is_file():
        raise ImportError(
            "custom_ffn needs vaswani's user_plugin: pip install -e <vaswani repository>, "
            "or keep examples/custom_ffn inside the repository"
        )
    return candidate


def load_vaswani_plugin() -> None:
    """Register vaswani's model, criterion, scheduler and tasks, as --user-dir would."""
    utils.import_user_module(Namespace(user_dir=str(vaswani_plugin_dir())))


load_vaswani_plugin()

from .models import gated_ffn_transformer  # noqa: E402,F401  (registers the model, arch)
