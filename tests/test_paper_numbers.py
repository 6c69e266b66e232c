"""The paper's decoding and training numbers (beam 4, alpha 0.6, source + 50, label smoothing
0.1, warm-up 4000) are defined once, in ``user_plugin/paper.py``: every default of a parameter,
dataclass field or command-line option that holds one of them is a name imported from there,
never a literal. Prose (docstrings, help texts) may say the numbers."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from cli import REPO

from user_plugin import paper

#: Parameter, field and option names whose default is one of the paper's numbers.
PAPER_SETTINGS = {
    "beam", "beam_size", "lenpen", "alpha", "length_penalty", "max_len_over_source",
    "max_len_b", "label_smoothing", "warmup_updates", "warmup_steps",
}
PACKAGE = REPO / "user_plugin"


def _option_name(call: ast.Call) -> str | None:
    """``beam`` for ``add_argument("--beam", ...)``; None for another call."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
        return None
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = [f for f in flags if f.startswith("--")]
    return long[0][2:].replace("-", "_") if long else None


def _default_of_field(value: ast.expr | None) -> ast.expr | None:
    """The default of a dataclass field: ``x: int = DEFAULT`` or ``field(default=DEFAULT)``."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        return next((k.value for k in value.keywords if k.arg == "default"), None)
    return value


def paper_setting_defaults(path: Path):
    """``(line, name, default expression)`` of every default given to a paper setting in the
    module at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            pairs = list(zip(positional[len(positional) - len(arguments.defaults):],
                             arguments.defaults))
            pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)
                      if d is not None]
            for argument, default in pairs:
                if argument.arg in PAPER_SETTINGS:
                    yield node.lineno, argument.arg, default
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                        and item.target.id in PAPER_SETTINGS:
                    default = _default_of_field(item.value)
                    if default is not None:
                        yield item.lineno, item.target.id, default
        elif isinstance(node, ast.Call):
            name = _option_name(node)
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if name in PAPER_SETTINGS and default is not None:
                yield node.lineno, name, default


def is_number(expression: ast.expr) -> bool:
    if isinstance(expression, ast.UnaryOp):
        expression = expression.operand
    return isinstance(expression, ast.Constant) and isinstance(expression.value, (int, float)) \
        and not isinstance(expression.value, bool)


def test_paper_settings_default_to_names_of_paper_py_never_to_literals():
    literals, named = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "paper.py":
            continue
        for line, name, default in paper_setting_defaults(path):
            where = f"{path.relative_to(REPO)}:{line} {name}"
            if is_number(default):
                literals.append(f"{where} = {ast.unparse(default)}")
            else:
                named.append(where)
    assert literals == []
    # the scan sees the defaults of the hub, its command, both backends, the generator, the
    # criterion and the scheduler
    files = {where.split(":")[0] for where in named}
    assert {"user_plugin/hub/loader.py", "user_plugin/hub/translator.py",
            "user_plugin/hub/ctranslate2_translator.py", "user_plugin/commands/translate.py",
            "user_plugin/generation/gnmt_sequence_generator.py",
            "user_plugin/criterions/label_smoothed_cross_entropy.py",
            "user_plugin/lr_schedulers/inverse_sqrt_warmup.py"} <= files, sorted(files)


def test_the_scan_finds_a_literal_default(tmp_path):
    module = PACKAGE / "paper.py"  # the one file where the literals belong
    found = {name: ast.unparse(default) for _, name, default in paper_setting_defaults(module)}
    assert found == {}  # paper.py defines names, no parameter defaults
    source = ("def f(beam: int = 4, *, lenpen=0.6): ...\n"
              "class C:\n    label_smoothing: float = field(default=0.1)\n"
              "p.add_argument('--warmup-updates', type=int, default=4000)\n")
    probe = tmp_path / "probe.py"
    probe.write_text(source, encoding="utf-8")
    found = {name: ast.unparse(default) for _, name, default in paper_setting_defaults(probe)}
    assert found == {"beam": "4", "lenpen": "0.6", "label_smoothing": "0.1",
                     "warmup_updates": "4000"}


def test_the_defaults_are_the_papers_values():
    from user_plugin.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyConfig,
    )
    from user_plugin.hub.loader import load_translator
    from user_plugin.lr_schedulers.inverse_sqrt_warmup import InverseSqrtWarmupConfig

    parameters = inspect.signature(load_translator).parameters
    assert (parameters["beam"].default, parameters["lenpen"].default,
            parameters["max_len_over_source"].default) == (4, 0.6, 50) \
        == (paper.BEAM, paper.LENPEN, paper.MAX_LEN_OVER_SOURCE)
    assert LabelSmoothedCrossEntropyConfig().label_smoothing == paper.LABEL_SMOOTHING == 0.1
    assert InverseSqrtWarmupConfig().warmup_updates == paper.WARMUP_STEPS == 4000
