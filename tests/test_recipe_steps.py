"""The recipes' step engine (``user_plugin/recipe_steps.py``, the command ``vaswani-step``) on
small directories, without training: records, identities of inputs (the same as the shell
engine's before it, so that finished work stays finished), the checks of a step, and what a
training step does with the work it finds (resume, continue a finished run whose MAX_UPDATE
grew, start over on new data, refuse anything else unless asked to start over).
``recipes/common.sh`` is a thin layer over the command; the recipes' own tests run it."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import forked_cli
import pytest
from conftest import REPO

from user_plugin import recipe_steps as steps
from user_plugin.commands import recipe_step
from user_plugin.files import run_main
from user_plugin.files.training_state import TRAINING_LOCK

CONFIG = "v1 en-de arch=tiny max_update=6 warmup=4 extra=--dropout 0.1"


def vaswani_step(*words, capsys) -> tuple[int, str, str]:
    """``vaswani-step WORDS`` in this process: status, stdout, stderr."""
    status = run_main(recipe_step.main, [str(word) for word in words], recipe_step.PROG)
    out, err = capsys.readouterr()
    return status, out, err


def finished_step(directory: Path, config: str = "cfg", upstreams=(), outputs=("a.txt",),
                  text: str | None = None):
    directory.mkdir(parents=True, exist_ok=True)
    for name in outputs:
        (directory / name).write_text(text or f"{name}\n", encoding="utf-8")
    return steps.mark_done(directory, config, [str(u) for u in upstreams], outputs)


def listing(directory: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.iterdir()) if p.is_file()}


def training_dir(tmp_path: Path, record: str | None = None, config: str = CONFIG,
                 upstreams=()) -> Path:
    """A save directory with two checkpoints and, optionally, a ``done`` or ``started``
    record of ``config``."""
    directory = tmp_path / "checkpoints"
    directory.mkdir(parents=True)
    (directory / "checkpoint_1_3.pt").write_bytes(b"three")
    (directory / "checkpoint_last.pt").write_bytes(b"six")
    if record == "done":
        steps.mark_done(directory, config, upstreams, ["checkpoint_last.pt",
                                                       "checkpoint_1_3.pt"])
    elif record == "started":
        steps.begin(directory, config, upstreams)
    return directory


# ---------------------------------------------------------------------------------------------
# Records and identities


def test_a_record_holds_id_settings_inputs_and_outputs_and_reads_back(tmp_path):
    up = tmp_path / "a dir with spaces" / "up"
    finished_step(up)
    (tmp_path / "down" / "sub").mkdir(parents=True)
    record = finished_step(tmp_path / "down", CONFIG, [up], ["b.txt", "sub/c.txt"])
    text = (tmp_path / "down" / ".done").read_text(encoding="utf-8")
    assert text.startswith("# written when the step finished; delete this file")
    assert f"\nid {record.id}\n" in text
    assert f"\nconfig {hashlib.sha256(CONFIG.encode()).hexdigest()}\n" in text
    assert f"\nsettings {CONFIG}\n" in text
    assert f"\nupstream {up} {steps.input_id(up)}\n" in text
    assert "\noutput 6 b.txt\noutput 10 sub/c.txt\n" in text
    assert steps.read_record(tmp_path / "down" / ".done") == record
    assert steps.new_run_id() != steps.new_run_id()


def test_records_of_the_shell_engine_before_it_are_still_understood(tmp_path):
    """A ``.done`` written by the earlier shell engine (no ``settings`` line) is done for the
    same settings and inputs, and redone, without naming the change, for others."""
    up = tmp_path / "up"
    finished_step(up)
    down = tmp_path / "down"
    down.mkdir()
    (down / "out").write_text("result\n")
    digest = hashlib.sha256(b"v1 old config").hexdigest()
    (down / ".done").write_text(
        "# written when the step finished; delete this file to redo the step\n"
        f"id 20240101T000000-42-123\nconfig {digest}\n"
        f"upstream {up} {steps.input_id(up)}\noutput 7 out\n", encoding="utf-8")
    assert steps.done_problem(down, "v1 old config", [str(up)]) is None
    assert steps.done_problem(down, "v1 new config", [str(up)]) == "its settings changed"
    assert steps.input_id(down) == "20240101T000000-42-123"


# The shell engine's content_id, as recipes/common.sh had it: directories made outside the
# recipes and recorded by it must keep their identity.
SHELL_CONTENT_ID = r"""
content_id() {
  local dir=$1 file size LC_ALL=C
  {
    for file in "$dir"/*; do
      [ -f "$file" ] || continue
      size=$(wc -c < "$file" | tr -d ' ')
      printf '%s %s' "$(basename "$file")" "$size"
      [ "$size" -gt 16777216 ] || printf ' %s' "$(sha256sum < "$file" | cut -d' ' -f1)"
      printf '\n'
    done
  } | sha256sum | cut -c1-32 | sed 's/^/content-/'
}
content_id "$1"
"""


def test_content_id_is_the_shell_engines_and_ignores_where_the_directory_is(tmp_path):
    data = tmp_path / "my data"
    data.mkdir()
    (data / "dict.en.txt").write_text("the 5\n")
    (data / "Zeta.bin").write_bytes(b"\x00\x01")
    (data / "ärger.idx").write_text("ä\n", encoding="utf-8")
    (data / ".hidden").write_text("not counted\n")
    (data / "sub").mkdir()
    (data / "link").symlink_to("dict.en.txt")
    with open(data / "large.bin", "wb") as handle:  # counted by size only (sparse: fast)
        handle.truncate(steps.CONTENT_HASH_LIMIT + 1)
    shell = forked_cli.run(["bash", "-c", SHELL_CONTENT_ID, "content_id", str(data)],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert steps.content_id(data) == shell
    assert steps.input_id(data) == shell
    data.rename(tmp_path / "moved")
    assert steps.content_id(tmp_path / "moved") == shell
    (tmp_path / "moved" / ".hidden").write_text("changed\n")
    assert steps.content_id(tmp_path / "moved") == shell
    (tmp_path / "moved" / "dict.en.txt").write_text("tha 5\n")  # same size, other content
    assert steps.content_id(tmp_path / "moved") != shell


def test_a_step_redone_into_the_same_bytes_is_the_same_input(tmp_path):
    data = tmp_path / "data-bin"
    first = finished_step(data)
    directory = training_dir(tmp_path / "run", "done", upstreams=[str(data)])
    again = finished_step(data)  # binarized again: the same bytes, a new record
    assert again.id == first.id and first.id.startswith("outputs-")
    assert steps.begin_training(directory, CONFIG, [str(data)]).action == "done"
    assert sorted(p.name for p in directory.iterdir()) == [
        ".done", "checkpoint_1_3.pt", "checkpoint_last.pt"]
    assert finished_step(data, text="other\n").id != first.id
    assert steps.begin(tmp_path / "partial", CONFIG, []).id != \
        steps.begin(tmp_path / "partial", CONFIG, []).id  # partial work: a new run each time


def test_input_ids_of_a_step_a_file_and_a_missing_path(tmp_path):
    record = finished_step(tmp_path / "step")
    assert steps.input_id(tmp_path / "step") == record.id
    (tmp_path / "raw.en").write_text("Hello\n")
    assert steps.input_id(tmp_path / "raw.en") == \
        "sha256-" + hashlib.sha256(b"Hello\n").hexdigest()
    assert steps.input_id(tmp_path / "nothing") == ""


# ---------------------------------------------------------------------------------------------
# Is a step done? Can a later step use it?


def test_a_step_is_done_until_its_settings_outputs_or_inputs_change(tmp_path):
    up, down = tmp_path / "up", tmp_path / "down"
    finished_step(up)
    finished_step(down, CONFIG, [up], ["b.txt"])
    assert steps.done_problem(down, CONFIG, [str(up)]) is None
    assert steps.done_problem(down, CONFIG.replace("warmup=4", "warmup=8"), [str(up)]) == \
        "its settings changed (warmup=4 -> warmup=8)"
    assert steps.done_problem(down, CONFIG, []) == "it now reads other inputs"
    (down / "b.txt").write_text("other size\n")
    assert steps.done_problem(down, CONFIG, [str(up)]) == \
        f"output {down / 'b.txt'} has changed size"
    (down / "b.txt").unlink()
    assert steps.done_problem(down, CONFIG, [str(up)]) == f"output {down / 'b.txt'} is missing"
    (down / "b.txt").write_text("b.txt\n")
    assert steps.done_problem(down, CONFIG, [str(up)]) is None
    finished_step(up)  # the upstream step redone into the same bytes: the same input
    assert steps.done_problem(down, CONFIG, [str(up)]) is None
    finished_step(up, text="other\n")  # redone into other bytes
    assert steps.done_problem(down, CONFIG, [str(up)]) == f"its input {up} was redone or changed"
    assert steps.done_problem(tmp_path / "none", CONFIG, []) == ""


def test_a_moved_directory_of_finished_steps_stays_finished(tmp_path):
    up, down = tmp_path / "a" / "up", tmp_path / "a" / "down"
    finished_step(up)
    finished_step(down, "cfg", [up])
    (tmp_path / "a").rename(tmp_path / "b")
    assert steps.done_problem(tmp_path / "b" / "down", "cfg", [str(tmp_path / "b" / "up")]) is None


def test_require_names_the_step_to_run_first_or_again(tmp_path):
    prepared, binarized = tmp_path / "prepared", tmp_path / "data-bin"
    assert steps.require_problem(binarized, "binarize") == \
        f"run the binarize step first (no marker {binarized / '.done'})"
    finished_step(prepared)
    finished_step(binarized, "cfg", [prepared])
    assert steps.require_problem(binarized, "binarize", [str(prepared)]) is None
    finished_step(prepared, text="prepared again, into other text\n")
    assert steps.require_problem(binarized, "binarize", [str(prepared)]) == \
        f"run the binarize step again: its input {prepared} was redone or changed since it ran"
    assert steps.require_problem(binarized, "binarize") is None
    (binarized / "a.txt").unlink()
    assert steps.require_problem(binarized, "binarize") == \
        f"run the binarize step first (output {binarized / 'a.txt'} is missing)"


def test_partial_work_continues_only_with_the_settings_and_inputs_it_started_with(tmp_path):
    up, work = tmp_path / "up", tmp_path / "work"
    finished_step(up)
    assert steps.continue_problem(work, "cfg", [str(up)]) == \
        f"no record of how the work in {work} was started"
    steps.begin(work, "cfg", [str(up)])
    assert steps.continue_problem(work, "cfg", [str(up)]) is None
    assert steps.continue_problem(work, "other", [str(up)]) == \
        f"the unfinished work in {work} cannot be continued: its settings changed (cfg -> other)"
    (work / "out").write_text("x")
    steps.mark_done(work, "cfg", [str(up)], ["out"])
    assert not (work / ".started").exists() and (work / ".done").is_file()


def test_settings_change_names_the_words_that_differ():
    assert steps.settings_change("a=1 b=2 extra=--x 3", "a=1 b=5 extra=--x 3 c=4") == \
        "b=2 -> b=5; (none) -> c=4"
    record = steps.Record(settings="v1 max_update=6 warmup=4")
    assert steps.grown_setting(record, "v1 max_update=9 warmup=4", "max_update") == (6, 9)
    assert steps.grown_setting(record, "v1 max_update=3 warmup=4", "max_update") == (6, 3)
    assert steps.grown_setting(record, "v1 max_update=9 warmup=5", "max_update") is None
    assert steps.grown_setting(record, "v1 max_update=6 warmup=5", "max_update") is None
    assert steps.grown_setting(steps.Record(), "v1 max_update=9", "max_update") is None


# ---------------------------------------------------------------------------------------------
# Restarting a step's directory


def test_restart_empties_a_directory_but_never_one_a_live_training_holds(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "checkpoint_last.pt").write_bytes(b"kept")
    lock = directory / TRAINING_LOCK
    lock.write_text("pid 4242 on somewhere, started earlier, fairseq-train\n")
    handle = os.open(lock, os.O_RDWR)
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        with pytest.raises(steps.StepRefused, match="is in use by a training run that is "
                           r"still going on \(pid 4242 on somewhere"):
            steps.restart(directory)
        with pytest.raises(steps.StepRefused, match="still going on"):
            steps.begin_training(directory, CONFIG, [], start_over=True)
        assert (directory / "checkpoint_last.pt").read_bytes() == b"kept"
    finally:
        os.close(handle)
    steps.restart(directory)  # a lock nobody holds is a leftover
    assert list(directory.iterdir()) == []
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "mine.txt").write_text("mine")
    (tmp_path / "link").symlink_to(target)
    steps.restart(tmp_path / "link")  # the link goes, not what it points to
    assert (target / "mine.txt").is_file() and (tmp_path / "link").is_dir()
    assert not (tmp_path / "link").is_symlink()


def test_step_directories_must_be_apart():
    steps_dirs = [("prepare", Path("/w/prepared")), ("binarize", Path("/w/data-bin"))]
    kept = [("WORK_DIR", Path("/w")), ("HOME", Path("/home/me"))]
    assert steps.overlap_problem(steps_dirs, kept) is None
    assert steps.overlap_problem([*steps_dirs, ("train", Path("/w/prepared/run"))], kept) == \
        "the prepare step's directory /w/prepared holds the train step's /w/prepared/run"
    assert steps.overlap_problem([("binarize", Path("/w"))], kept) == \
        "the binarize step's directory /w holds WORK_DIR (/w), which it would empty when redone"
    assert steps.overlap_problem([("binarize", Path("/"))], kept) is not None


# ---------------------------------------------------------------------------------------------
# What a training step does with the work it finds


def test_a_training_run_starts_fresh_or_over_where_nothing_is_lost(tmp_path):
    plan = steps.begin_training(tmp_path / "new", CONFIG, [])
    assert plan.action == "fresh" and (tmp_path / "new" / ".started").is_file()
    # checkpoints that no record describes (a deleted .done): the step is redone
    directory = training_dir(tmp_path)
    plan = steps.begin_training(directory, CONFIG, [])
    assert plan.action == "start-over" and "have no record" in plan.notes[0]
    assert sorted(p.name for p in directory.iterdir()) == [".started"]


def test_an_interrupted_run_resumes_and_may_be_given_more_updates(tmp_path):
    directory = training_dir(tmp_path, "started")
    before = listing(directory)
    assert steps.begin_training(directory, CONFIG, []).notes == [
        f"resuming in {directory} (from its newest intact checkpoint)"]
    grown = CONFIG.replace("max_update=6", "max_update=9")
    plan = steps.begin_training(directory, grown, [])
    assert plan.action == "resume" and plan.notes == [
        f"resuming in {directory} (from its newest intact checkpoint), now to MAX_UPDATE=9 "
        "(it was started for 6)"]
    after = listing(directory)
    assert {n: v for n, v in after.items() if n != ".started"} == \
        {n: v for n, v in before.items() if n != ".started"}
    assert steps.read_record(directory / ".started").settings == grown


@pytest.mark.parametrize("old, new, words", [
    ("warmup=4", "warmup=8", "its settings changed (warmup=4 -> warmup=8)"),
    ("max_update=6", "max_update=3",
     "it was started for MAX_UPDATE=6 and may be past the MAX_UPDATE=3 asked for now"),
])
def test_an_interrupted_run_with_other_settings_is_refused_unless_started_over(tmp_path, old,
                                                                                  new, words):
    directory = training_dir(tmp_path, "started")
    asked = CONFIG.replace(old, new)
    before = listing(directory)
    with pytest.raises(steps.StepRefused) as refusal:
        steps.begin_training(directory, asked, [])
    message = str(refusal.value)
    assert message.startswith(f"the unfinished work in {directory} cannot be continued: ")
    assert words in message and "set START_OVER=1" in message and "\n" not in message
    assert listing(directory) == before
    plan = steps.begin_training(directory, asked, [], start_over=True)
    assert plan.action == "start-over"
    assert plan.notes[-1] == f"starting over in {directory} (START_OVER=1)"
    assert sorted(p.name for p in directory.iterdir()) == [".started"]


def test_new_data_starts_an_interrupted_or_finished_run_over(tmp_path):
    data = tmp_path / "data-bin"
    finished_step(data)
    for record in ("started", "done"):
        directory = training_dir(tmp_path / record, record, upstreams=[str(data)])
        finished_step(data, text=f"binarized again for the {record} run\n")
        plan = steps.begin_training(directory, CONFIG, [str(data)])
        assert plan.action == "start-over"
        assert f"its input {data} was redone or changed" in plan.notes[0]
        assert sorted(p.name for p in directory.iterdir()) == [".started"]


def test_a_finished_run_continues_when_only_max_update_grew(tmp_path):
    directory = training_dir(tmp_path, "done")
    finished = steps.read_record(directory / ".done")
    before = listing(directory)
    assert steps.begin_training(directory, CONFIG, []).action == "done"
    assert listing(directory) == before
    grown = CONFIG.replace("max_update=6", "max_update=9")
    plan = steps.begin_training(directory, grown, [])
    assert plan.action == "continue" and plan.notes == [
        f"continuing the finished run in {directory}: MAX_UPDATE grew from 6 to 9; its "
        "checkpoints are kept and training resumes from its last one (update 6)"]
    for name in ("checkpoint_1_3.pt", "checkpoint_last.pt"):
        assert (directory / name).read_bytes() == before[name][2]
    assert not (directory / ".done").exists()
    assert steps.read_record(directory / ".started").continues == finished.id
    # interrupted while continuing: resumed, still continuing the same finished run
    assert steps.begin_training(directory, grown, []).action == "resume"
    (directory / "checkpoint_1_9.pt").write_bytes(b"nine")
    steps.mark_done(directory, grown, [], ["checkpoint_last.pt", "checkpoint_1_3.pt",
                                           "checkpoint_1_9.pt"])
    assert steps.done_problem(directory, grown, []) is None
    assert steps.read_record(directory / ".done").id != finished.id


def test_a_finished_run_being_continued_is_not_done(tmp_path):
    """A kill between the ``.started`` of the continuation and the removal of the old ``.done``
    leaves both: the ``.done`` no longer counts."""
    directory = training_dir(tmp_path, "done")
    finished = steps.read_record(directory / ".done")
    grown = CONFIG.replace("max_update=6", "max_update=9")
    steps.begin(directory, grown, [], continues=finished.id)
    assert steps.done_problem(directory, CONFIG, []) == ""
    assert "run the train step first" in steps.require_problem(directory, "train")
    assert steps.begin_training(directory, grown, []).action == "resume"
    assert not (directory / ".done").exists()


@pytest.mark.parametrize("asked, lost, words", [
    (CONFIG.replace("warmup=4", "warmup=8"), None,
     "the finished run in {d} differs: its settings changed (warmup=4 -> warmup=8)"),
    (CONFIG.replace("max_update=6", "max_update=3"), None,
     "the run in {d} finished at MAX_UPDATE=6, past the MAX_UPDATE=3 asked for now (set "
     "MAX_UPDATE=6 to use it)"),
    (CONFIG, "checkpoint_1_3.pt",
     "the finished run in {d} differs: output {d}/checkpoint_1_3.pt is missing"),
])
def test_a_finished_run_is_never_deleted_unless_asked(tmp_path, asked, lost, words):
    directory = training_dir(tmp_path, "done")
    if lost:
        (directory / lost).unlink()
    before = listing(directory)
    with pytest.raises(steps.StepRefused) as refusal:
        steps.begin_training(directory, asked, [])
    assert str(refusal.value) == words.format(d=directory) + (
        "; starting over would delete its checkpoints: set START_OVER=1 to do so, or train "
        "into another directory (nothing was changed)")
    assert listing(directory) == before
    plan = steps.begin_training(directory, asked, [], start_over=True)
    assert plan.action == "start-over" and plan.notes[0] == words.format(d=directory)
    assert sorted(p.name for p in directory.iterdir()) == [".started"]


# ---------------------------------------------------------------------------------------------
# The command


def test_the_command_answers_by_status_and_one_line(tmp_path, capsys):
    up, down = tmp_path / "-up", tmp_path / "down dir"
    assert vaswani_step("restart", up, capsys=capsys)[0] == 0
    (up / "a.txt").write_text("a")
    assert vaswani_step("done", up, "-v1 cfg", "--", "a.txt", capsys=capsys) == (0, "", "")
    assert vaswani_step("status", up, "-v1 cfg", capsys=capsys) == (0, "", "")
    assert vaswani_step("status", up, "-v1 other", capsys=capsys) == \
        (3, "its settings changed (cfg -> other)\n", "")
    assert vaswani_step("status", down, "cfg", up, capsys=capsys) == (3, "", "")
    status, out, _ = vaswani_step("require", down, "binarize", capsys=capsys)
    assert status == 3 and out.startswith("run the binarize step first (no marker ")
    status, out, _ = vaswani_step("begin-training", down, CONFIG, up, capsys=capsys)
    assert (status, out) == (0, f"starting a new run in {down}\nfresh\n")
    assert vaswani_step("can-continue", down, CONFIG, up, capsys=capsys) == (0, "", "")
    (down / "checkpoint_last.pt").write_bytes(b"x")
    status, out, _ = vaswani_step("begin-training", down, CONFIG + " seed=2", up, capsys=capsys)
    assert status == 3 and out.count("\n") == 1 and "set START_OVER=1" in out
    status, out, _ = vaswani_step("begin-training", "--start-over", down, CONFIG + " seed=2", up,
                                  capsys=capsys)
    assert status == 0 and out.endswith(f"starting over in {down} (START_OVER=1)\nstart-over\n")
    assert vaswani_step("id", up, capsys=capsys)[1] == steps.input_id(up) + "\n"
    assert vaswani_step("apart", "a=/x", "b=/x/y", "--", "HOME=/h", capsys=capsys) == \
        (3, "the a step's directory /x holds the b step's /x/y\n", "")


@pytest.mark.parametrize("words, message", [
    ([], "unknown subcommand: one of status, require,"),
    (["stauts"], "unknown subcommand 'stauts'"),
    (["status", "/tmp"], "usage: vaswani-step status DIR CONFIG [UPSTREAM...]"),
    (["done", "/tmp/x", "cfg"], "usage: vaswani-step done DIR CONFIG [UPSTREAM...] -- OUTPUT..."),
    (["restart"], "usage: vaswani-step restart DIR"),
    (["apart", "nowhere"], "apart takes NAME=DIR words, got 'nowhere'"),
])
def test_bad_words_are_one_error_line_and_status_1(words, message, capsys):
    status, out, err = vaswani_step(*words, capsys=capsys)
    assert status == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"vaswani-step: error: {message}")


def test_an_output_that_was_not_written_is_one_error_line_and_no_record(tmp_path, capsys):
    status, _, err = vaswani_step("done", tmp_path, "cfg", "--", "missing.txt", capsys=capsys)
    assert status == 1
    assert err == f"vaswani-step: error: step output {tmp_path / 'missing.txt'} was not written\n"
    assert not (tmp_path / ".done").exists()


def test_start_over_takes_0_or_1_only(tmp_path):
    from test_recipes import recipe_env, run_script, step_script

    result = run_script(step_script("train"), recipe_env(WORK_DIR=tmp_path, START_OVER="yes"),
                        "wmt14_en_de", check=False)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == \
        "train: error: START_OVER must be 0 or 1, got 'yes'"
    assert not (tmp_path / "base").exists()


def test_the_shell_layer_is_thin_and_the_lock_name_is_defined_once():
    common = (REPO / "recipes" / "common.sh").read_text(encoding="utf-8")
    assert common.count("\n") <= 250
    for word in ("sha256sum", "flock", "awk", "rm -rf"):
        assert word not in common, word
    shell = [p for p in (REPO / "recipes").rglob("*.sh") if TRAINING_LOCK in p.read_text()]
    python = [p for p in (REPO / "user_plugin").rglob("*.py")
              if f'"{TRAINING_LOCK}"' in p.read_text(encoding="utf-8")]
    assert shell == [] and [p.name for p in python] == ["training_state.py"]
