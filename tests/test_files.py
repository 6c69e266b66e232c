"""user_plugin.files: one-line errors naming the file, atomic writes and copies, text lines,
checkpoint reading."""

from __future__ import annotations

import errno
import os
import pickle
import stat
from fractions import Fraction

import pytest
import torch

from user_plugin.files import (
    LOAD_ERRORS,
    TEMP_SUFFIX,
    CheckpointError,
    UserError,
    atomic_copy,
    atomic_write,
    atomic_write_text,
    file_error,
    first_line,
    iter_lines,
    read_checkpoint,
    read_lines,
    run_main,
    temp_destination,
)
from user_plugin.hub import HubError


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


def test_hub_errors_are_user_errors_and_runtime_errors():
    assert issubclass(HubError, UserError) and issubclass(HubError, RuntimeError)
