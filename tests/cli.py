"""Run fairseq's command-line tools (the real entry points) from tests, and read their logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import forked_cli

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "user_plugin")

TINY_MODEL_ARGS = [
    "--arch", "vaswani_base",
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings", "--dropout", "0.1",
]
PAPER_OPTIMIZATION_ARGS = [
    "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-9",
    "--lr", "1", "--lr-scheduler", "vaswani_inverse_sqrt",
    "--criterion", "vaswani_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
]


#: The start of a script run as stock fairseq: any import of ``user_plugin`` raises.
REFUSE_OUR_PLUGIN = """
import sys

class RefuseOurPlugin:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "user_plugin":
            raise ImportError("stock fairseq tried to import " + name)
        return None

sys.meta_path.insert(0, RefuseOurPlugin())
"""


def fairseq_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(module: str) -> List[str]:
    """The argument list that runs ``user_plugin.commands.<module>`` of this checkout the way its
    installed console script does (``from ... import cli_main; sys.exit(cli_main())``), whatever
    the environment has installed; append the command's arguments."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            f"from user_plugin.commands.{module} import cli_main; sys.exit(cli_main())")
    return [sys.executable, "-c", code]


def run_fairseq(tool: str, args: Sequence[str], cwd: Path | None = None,
                timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``python -m fairseq_cli.<tool>`` (in a process forked with fairseq's libraries already
    imported: :mod:`forked_cli`); raise with its output if it fails."""
    cmd = [sys.executable, "-m", f"fairseq_cli.{tool}", *map(str, args)]
    proc = forked_cli.run(cmd, cwd=cwd, env=fairseq_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"fairseq-{tool} failed ({proc.returncode}):\n{' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc


def json_log_records(text: str, tag: str) -> List[dict]:
    """Records of fairseq's ``--log-format json`` lines whose tag is ``tag`` ("train_inner"...)."""
    records = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0 or f"| {tag} | " not in line[:start]:
            continue
        try:
            records.append(json.loads(line[start:]))
        except json.JSONDecodeError:
            continue
    return records


def hypotheses(generate_output: str) -> Dict[int, dict]:
    """Parse fairseq-generate's S/H/P lines: id -> {"source", "score", "tokens", "positional"}
    of the best hypothesis (the first H line of each id)."""
    out: Dict[int, dict] = {}
    for line in generate_output.splitlines():
        kind, _, rest = line.partition("-")
        if kind not in ("S", "H", "P") or "\t" not in rest:
            continue
        head, *fields = rest.split("\t")
        entry = out.setdefault(int(head), {})
        if kind == "S":
            entry["source"] = fields[0].split()
        elif kind == "H" and "score" not in entry:
            entry["score"], entry["tokens"] = float(fields[0]), fields[1].split()
        elif kind == "P" and "positional" not in entry:
            entry["positional"] = [float(s) for s in fields[0].split()]
    return out
