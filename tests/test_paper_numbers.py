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
    "max_len_b", "label_smoothing", "warmup_updates", "warmup_steps", "dropout", "adam_betas",
    "betas", "adam_eps", "eps",
}
PACKAGE = REPO / "user_plugin"
#: The paper's value of each setting, where a literal copy of it is looked for in option lists,
#: dictionaries and keyword arguments.
PAPER_VALUES = {
    "beam": paper.BEAM, "lenpen": paper.LENPEN, "label_smoothing": paper.LABEL_SMOOTHING,
    "warmup_updates": paper.WARMUP_STEPS, "dropout": paper.DROPOUT,
    "adam_betas": paper.ADAM_BETAS, "betas": paper.ADAM_BETAS, "adam_eps": paper.ADAM_EPS,
    "eps": paper.ADAM_EPS,
}
#: What is scanned: the plugin and the scripts.
SCANNED = [PACKAGE, REPO / "scripts"]


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


def _value(expression: ast.expr):
    """The value a literal stands for (a string of a number or tuple parsed), else None."""
    try:
        value = ast.literal_eval(expression)
    except ValueError:
        return None
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, list):
        value = tuple(value)
    return value


def _is_paper_value(name: str, expression: ast.expr) -> bool:
    expected = PAPER_VALUES.get(name)
    value = _value(expression)
    return expected is not None and value is not None and not isinstance(value, bool) \
        and value == expected


def paper_value_literals(path: Path):
    """``(line, setting, literal)`` of every literal copy of one of the paper's values in the
    module at ``path``: after an option in a command-line list (``["--adam-eps", "1e-9"]``),
    as the value of a dictionary key (``{"adam_betas": "(0.9, 0.98)"}``) or of a keyword
    argument (``Adam(..., eps=1e-9)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            for flag, value in zip(node.elts, node.elts[1:]):
                if isinstance(flag, ast.Constant) and isinstance(flag.value, str) \
                        and flag.value.startswith("--"):
                    name = flag.value[2:].replace("-", "_")
                    if _is_paper_value(name, value):
                        yield node.lineno, name, ast.unparse(value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) \
                        and _is_paper_value(key.value, value):
                    yield node.lineno, key.value, ast.unparse(value)
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg and _is_paper_value(keyword.arg, keyword.value):
                    yield node.lineno, keyword.arg, ast.unparse(keyword.value)


def scanned_modules():
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            if path != PACKAGE / "paper.py":
                yield path


def test_no_command_line_list_dictionary_or_keyword_copies_a_paper_value():
    found = [f"{path.relative_to(REPO)}:{line} {name} = {literal}"
             for path in scanned_modules() for line, name, literal in paper_value_literals(path)]
    assert found == []


def test_the_literal_scan_finds_copies_in_lists_dictionaries_and_keywords(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("ARGS = ['--adam-betas', '(0.9,0.98)', '--adam-eps', '1e-9', '--beam', '5']\n"
                     "S = {'adam_betas': '(0.9, 0.98)', 'dropout': 0.3}\n"
                     "torch.optim.Adam(p, betas=(0.9, 0.98), eps=1e-9)\n"
                     "set_dims(args, dropout=0.1)\n", encoding="utf-8")
    found = sorted((name, literal) for _, name, literal in paper_value_literals(probe))
    assert found == sorted([("adam_betas", "'(0.9,0.98)'"), ("adam_eps", "'1e-9'"),
                            ("adam_betas", "'(0.9, 0.98)'"), ("betas", "(0.9, 0.98)"),
                            ("eps", "1e-09"), ("dropout", "0.1")])


def is_number(expression: ast.expr) -> bool:
    if isinstance(expression, ast.UnaryOp):
        expression = expression.operand
    return isinstance(expression, ast.Constant) and isinstance(expression.value, (int, float)) \
        and not isinstance(expression.value, bool)


def test_paper_settings_default_to_names_of_paper_py_never_to_literals():
    literals, named = [], []
    for path in scanned_modules():
        for line, name, default in paper_setting_defaults(path):
            where = f"{path.relative_to(REPO)}:{line} {name}"
            # a setting of other modules too (dropout 0.0 of an attention) counts when it
            # copies the paper's value; the decoding and schedule settings always
            if is_number(default) and (name not in PAPER_VALUES or name in (
                    "beam", "lenpen", "label_smoothing", "warmup_updates")
                    or _is_paper_value(name, default)):
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
