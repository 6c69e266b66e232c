"""user_plugin.files: one-line errors naming the file, atomic writes and copies, text lines,
checkpoint reading, checking and writing, directory locks."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import stat
import subprocess
import sys
from fractions import Fraction

import forked_cli
import pytest
import torch

from user_plugin.artifacts.checkpoints import (
    LOAD_ERRORS,
    CheckpointError,
    checkpoint_integrity_problem,
    read_checkpoint,
    save_checkpoint,
    state_dict_mismatch,
)
from user_plugin.artifacts.errors import ArtifactError
from user_plugin.files import (
    TEMP_SUFFIX,
    DirectoryInUse,
    DirectoryLock,
    UserError,
    atomic_copy,
    atomic_write,
    atomic_write_text,
    file_error,
    first_line,
    iter_lines,
    read_lines,
    remove_stale_temporaries,
    run_main,
    temp_destination,
)


def usual_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def test_first_line_and_run_main(capsys):
    assert first_line(ValueError("\n  first  \nsecond")) == "first"
    assert first_line(KeyError("cfg"), with_type=True) == "KeyError: 'cfg'"
    assert first_line(EOFError()) == "EOFError"

    def main(argv):
        raise UserError(f"{argv[0]}: no such file")

    assert run_main(main, ["a.txt"], "tool.py") == 1
    assert capsys.readouterr().err == "tool.py: error: a.txt: no such file\n"


@pytest.mark.parametrize("error, writing, expected", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "f"), False, "f: no such file"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "f"), False,
     "f: is a directory, expected a file"),
    (PermissionError(errno.EACCES, "Permission denied", "f"), False,
     "f: cannot read (permission denied)"),
    (OSError(errno.ENOSPC, "No space left on device", "f"), True,
     "f: cannot write (no space left on device)"),
    (OSError(errno.EIO, "Input/output error", "f"), False, "f: cannot read (input/output error)"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "f"), True,
     "f: cannot write (no such file or directory)"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), False,
     "f: not valid UTF-8 text"),
])
def test_file_error_is_one_line_naming_the_file(error, writing, expected):
    result = file_error("f", error, writing=writing)
    assert isinstance(result, UserError) and str(result) == expected


def test_text_lines_and_their_errors(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\ntwo\rthree\nlast")
    assert read_lines(path) == ["one", "two", "three", "last"]
    assert list(iter_lines(path)) == ["one\r", "two\rthree", "last"]
    with pytest.raises(UserError, match=r"missing\.txt: no such file$"):
        read_lines(tmp_path / "missing.txt")
    with pytest.raises(UserError, match=r": is a directory, expected a text file$"):
        list(iter_lines(tmp_path))
    (tmp_path / "latin1.txt").write_bytes("Stra\xdfe\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.txt: not valid UTF-8 text$"):
        read_lines(tmp_path / "latin1.txt")


def test_atomic_write_moves_a_complete_file_into_place_with_the_usual_mode(tmp_path):
    path = tmp_path / "new" / "out.txt"
    seen = []

    def write(temp: str) -> None:
        seen.append(temp)
        assert temp_destination(temp) == path
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write("complete")

    atomic_write(path, write)
    assert path.read_text(encoding="utf-8") == "complete"
    assert seen[0].endswith(TEMP_SUFFIX) and not os.path.exists(seen[0])
    assert stat.S_IMODE(path.stat().st_mode) == usual_mode()
    assert os.listdir(path.parent) == ["out.txt"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")

    def fail(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, fail)

    def disk_full(temp: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", temp)

    with pytest.raises(UserError, match=r"out\.txt: cannot write \(no space left on device\)$"):
        atomic_write(path, disk_full)
    assert path.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_atomic_copy(tmp_path):
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(b"\x00\x01" * 1000)
    dst.write_bytes(b"old")
    atomic_copy(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    with pytest.raises(UserError, match=r"absent\.bin: no such file$"):
        atomic_copy(tmp_path / "absent.bin", dst)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["dst.bin", "src.bin"]


def test_temp_destination_recognises_only_our_temporary_names(tmp_path):
    assert temp_destination(tmp_path / f".checkpoint_last.pt.ab_c12{TEMP_SUFFIX}") == (
        tmp_path / "checkpoint_last.pt")
    for name in (".done.tmp", ".table.md.tmp", "checkpoint_1_20.pt.tmp", "model.pt",
                 f"x.pt{TEMP_SUFFIX}"):
        assert temp_destination(tmp_path / name) is None


def test_load_errors_cover_what_loading_raises():
    for kind in (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, OSError, TypeError,
                 AttributeError, KeyError, IndexError, ImportError):
        assert issubclass(kind, LOAD_ERRORS)


def fairseq_like(path):
    torch.save({"cfg": {"model": None}, "model": {"w": torch.ones(2)}}, path)
    return path


def test_read_checkpoint_and_its_one_line_errors(tmp_path):
    good = fairseq_like(tmp_path / "good.pt")
    assert torch.equal(read_checkpoint(good)["model"]["w"], torch.ones(2))
    cases = {
        "missing.pt": (None, "missing.pt: no such file"),
        "empty.pt": (b"", "empty.pt: not a readable PyTorch checkpoint (empty file (0 bytes))"),
        "text.pt": (b"hello\n", "text.pt: not a readable PyTorch checkpoint (not a PyTorch file"),
        "truncated.pt": (good.read_bytes()[:200],
                         "truncated.pt: not a readable PyTorch checkpoint (truncated or corrupt"),
    }
    for name, (content, message) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError) as info:
            read_checkpoint(tmp_path / name)
        assert str(info.value).startswith(f"{tmp_path / name}: ")
        assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UserError, match=r"is a directory, expected a checkpoint file$"):
        read_checkpoint(tmp_path)

    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(tmp_path / "foreign.pt")
    problem = "not a fairseq checkpoint (no 'model' entry)"
    assert str(info.value) == f"{tmp_path / 'foreign.pt'}: {problem}"
    assert info.value.problem == problem
    with pytest.raises(CheckpointError, match=r"not a fairseq checkpoint \(no 'best_loss' entry\)"):
        read_checkpoint(tmp_path / "foreign.pt", upgrade=True)
    torch.save({"model": {}}, tmp_path / "no_cfg.pt")
    with pytest.raises(CheckpointError, match=r"no 'cfg' entry"):
        read_checkpoint(tmp_path / "no_cfg.pt", required=("cfg",))


def test_read_checkpoint_refuses_unsafe_pickles(tmp_path):
    torch.save({"model": {}, "cfg": Fraction(1, 3)}, tmp_path / "unsafe.pt")  # not allow-listed
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(tmp_path / "unsafe.pt")
    assert "refused by safe loading" in str(info.value) and info.value.unreadable


def test_artifact_errors_are_user_errors_and_runtime_errors():
    assert issubclass(ArtifactError, UserError) and issubclass(ArtifactError, RuntimeError)


# ---------------------------------------------------------------------------------------------
# Integrity, verified writes, orphans, locks


def test_flipped_bytes_in_an_intact_archive_fail_the_crc_check(tmp_path):
    from fault_injection import flip_a_byte

    good = fairseq_like(tmp_path / "good.pt")
    assert checkpoint_integrity_problem(good) is None
    bad = tmp_path / "bad.pt"
    bad.write_bytes(good.read_bytes())
    flip_a_byte(bad, offset=3)
    assert torch.load(bad, weights_only=True)["model"]["w"][0] != 1  # torch does not notice
    problem = checkpoint_integrity_problem(bad)
    assert problem is not None and problem.startswith("corrupt: record '")
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(bad)
    assert str(info.value).startswith(f"{bad}: not a readable PyTorch checkpoint (corrupt: ")
    assert "fails its CRC-32 check" in str(info.value)
    assert read_checkpoint(bad, verify=False)["model"]["w"].shape == (2,)


def test_save_checkpoint_is_atomic_verified_and_one_line_on_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "out.pt"
    save_checkpoint({"model": {"w": torch.arange(5.0)}}, path)
    assert torch.equal(read_checkpoint(path)["model"]["w"], torch.arange(5.0))
    before = path.read_bytes()
    real_save = torch.save

    def save_onto_a_full_disk(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_onto_a_full_disk)
    with pytest.raises(UserError) as info:
        save_checkpoint({"model": {"w": torch.zeros(5)}}, path)
    assert str(info.value) == f"{path}: cannot write (no space left on device)"
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["out.pt"]

    def save_garbage(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 not an archive")

    monkeypatch.setattr(torch, "save", save_garbage)
    with pytest.raises(UserError, match="the written checkpoint does not read back: truncated"):
        save_checkpoint({"model": {}}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["out.pt"]


HOLD_A_FILE = """
import fcntl, os, sys, time
handle = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_orphaned_temporary_files_are_removed_but_not_those_being_written(tmp_path):
    orphan = tmp_path / f".out.txt.abc{TEMP_SUFFIX}"
    orphan.write_bytes(b"x" * 1000)
    live = tmp_path / f".other.txt.def{TEMP_SUFFIX}"
    live.write_bytes(b"y")
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_bytes(b"z")
    writer = subprocess.Popen([sys.executable, "-c", HOLD_A_FILE, str(live)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "held"
        assert remove_stale_temporaries(tmp_path) == [(orphan, 1000)]
        assert live.exists() and unrelated.exists()
        orphan.write_bytes(b"x")
        atomic_write_text(tmp_path / "out.txt", "new")  # cleans its directory first
        assert sorted(os.listdir(tmp_path)) == sorted([live.name, "notes.tmp", "out.txt"])
    finally:
        writer.kill()
        writer.wait()
    assert remove_stale_temporaries(tmp_path) == [(live, 1)]  # its writer is gone


HOLD_A_LOCK = """
import sys, time
from user_plugin.files import DirectoryLock
DirectoryLock.acquire(sys.argv[1], "run.lock", "test run")
print("locked", flush=True)
time.sleep(600)
"""


def test_a_directory_lock_is_held_by_one_process_and_taken_over_after_a_kill(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_LOCK, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DirectoryInUse) as info:
            DirectoryLock.acquire(tmp_path, "run.lock", "test run")
        assert str(info.value).startswith(f"{tmp_path} is in use by another test run "
                                          f"(pid {holder.pid} on ")
        assert "\n" not in str(info.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = DirectoryLock.acquire(tmp_path, "run.lock", "test run")
    assert lock.previous_holder.startswith(f"pid {holder.pid} on ")
    assert (tmp_path / "run.lock").read_text().startswith(f"pid {os.getpid()} on ")
    lock.release()
    assert not (tmp_path / "run.lock").exists()
    again = DirectoryLock.acquire(tmp_path, "run.lock", "test run")
    assert again.previous_holder == ""  # released cleanly: nothing to take over
    again.release()


HOLD_A_LOCK_AND_FORK = """
import os, sys, time
from user_plugin.files import DirectoryLock
DirectoryLock.acquire(sys.argv[1], "run.lock", "test run")
child = os.fork()
if child == 0:
    os.write(1, b"child running\\n")  # one write each: the lines never interleave
    time.sleep(600)
    os._exit(0)
os.write(1, f"{child}\\n".encode())
time.sleep(600)
"""


def test_a_forked_child_does_not_keep_the_lock_of_a_killed_holder(tmp_path):
    """A data loader's worker forked by the training process must not hold its lock."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_LOCK_AND_FORK, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, env=env)
    lines = sorted(holder.stdout.readline().strip() for _ in range(2))
    assert lines[1] == "child running"
    child = int(lines[0])
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        os.kill(child, 0)  # the child is still alive
        lock = DirectoryLock.acquire(tmp_path, "run.lock", "test run")
        assert lock.previous_holder.startswith(f"pid {holder.pid} on ")
        lock.release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_uncaught_user_errors_are_one_line_in_any_command(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text("import user_plugin.commands  # the table's one_line_errors row\n"
                      "from user_plugin.files import UserError\n"
                      "raise UserError('data.txt: no such file')\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = forked_cli.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and proc.stderr == "tool.py: error: data.txt: no such file\n"
    script.write_text("import user_plugin.commands  # the table's one_line_errors row\n"
                      "raise KeyError('other errors keep their traceback')\n", encoding="utf-8")
    proc = forked_cli.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_state_dict_mismatch_names_the_first_difference():
    model = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    assert state_dict_mismatch(model, {"a": torch.ones(2, 3), "b": torch.ones(4)}) is None
    assert state_dict_mismatch(model, {"a": torch.zeros(5, 3), "b": torch.zeros(4)}) == (
        "parameter 'a' has shape [5, 3] in the checkpoint but [2, 3] in the model "
        "(another vocabulary or architecture?)")
    assert "has no parameter 'b'" in state_dict_mismatch(model, {"a": torch.zeros(2, 3)})
    assert "has parameter 'c' that the model" in state_dict_mismatch(
        model, {**model, "c": torch.zeros(1)})
