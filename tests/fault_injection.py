"""Faults injected into the real ``fairseq-train``, from the outside.

:data:`WRAPPER` is a script that the tests write to a temporary directory and run instead of
``fairseq-train``: it installs, from ``FAULT_<NAME>`` environment variables, hooks that SIGKILL
the process at a chosen point, pause it, or make the disk look full, then runs fairseq's own
``cli_main``. The product code has no test hooks.

* ``FAULT_KILL_AFTER_UPDATE=N``: SIGKILL once update N is done;
* ``FAULT_KILL_IN_SAVE=K``: the K-th ``torch.save`` writes half an archive, then SIGKILL;
* ``FAULT_KILL_IN_COPY_TO_LAST=K``: the K-th copy to ``checkpoint_last.pt`` writes half, SIGKILL;
* ``FAULT_FAIRSEQ_COPY=1``: fairseq's own (non-atomic) copy instead of the plugin's;
* ``FAULT_KILL_AFTER_SAVE=N``: SIGKILL once the checkpoints of update N are all written;
* ``FAULT_PAUSE_AFTER_UPDATE=N`` with ``FAULT_PAUSE_FILE=PATH``: after update N, create
  ``PATH.paused`` and wait while ``PATH`` exists;
* ``FAULT_FULL_DISK_AT_WRITE=K``: the K-th file opened for writing in the save directory
  (checkpoints, their copies) fails with ENOSPC after 4 KiB, as a full disk does.
"""

from __future__ import annotations

import errno
import hashlib
import subprocess
import sys
from pathlib import Path

import forked_cli
from cli import REPO, fairseq_env

WRAPPER = r'''
"""fairseq-train with a fault injected from the environment (tests/fault_injection.py)."""
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.environ["FAULT_REPO"])


def die():
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


kill_after_update = int(os.environ.get("FAULT_KILL_AFTER_UPDATE", "0"))
kill_in_save = int(os.environ.get("FAULT_KILL_IN_SAVE", "0"))
kill_in_copy = int(os.environ.get("FAULT_KILL_IN_COPY_TO_LAST", "0"))
kill_after_save = int(os.environ.get("FAULT_KILL_AFTER_SAVE", "0"))
pause_after_update = int(os.environ.get("FAULT_PAUSE_AFTER_UPDATE", "0"))
full_disk_at_write = int(os.environ.get("FAULT_FULL_DISK_AT_WRITE", "0"))

if os.environ.get("FAULT_FAIRSEQ_COPY") == "1":
    # the control: the plugin loaded with its atomic copy switched off, so fairseq's own
    # (non-atomic) copy runs (the row puts its copy in place only while a save of ours runs)
    os.environ["VASWANI_FAIRSEQ_PATCHES"] = "off:atomic_checkpoint_copy"

if kill_after_update or pause_after_update:
    from fairseq.trainer import Trainer
    train_step = Trainer.train_step

    def train_step_with_fault(self, *args, **kwargs):
        out = train_step(self, *args, **kwargs)
        if kill_after_update and self.get_num_updates() >= kill_after_update:
            die()
        if pause_after_update and self.get_num_updates() == pause_after_update:
            pause = os.environ["FAULT_PAUSE_FILE"]
            open(pause + ".paused", "w").close()
            while os.path.exists(pause):
                time.sleep(0.1)
        return out

    Trainer.train_step = train_step_with_fault

if kill_in_save:
    import torch
    save, calls = torch.save, [0]

    def save_half_then_die(obj, f, *args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_in_save and not isinstance(f, (str, os.PathLike)):
            f.write(b"PK\x03\x04 half a checkpoint")
            f.flush()
            die()
        return save(obj, f, *args, **kwargs)

    torch.save = save_half_then_die

if kill_in_copy:
    copyfile, copies = shutil.copyfile, [0]

    def copy_half_then_die(src, dst, *args, **kwargs):
        if "checkpoint_last.pt" in os.path.basename(str(dst)):
            copies[0] += 1
            if copies[0] == kill_in_copy:
                with open(src, "rb") as fin, open(dst, "wb") as fout:
                    fout.write(fin.read(os.path.getsize(src) // 2))
                die()
        return copyfile(src, dst, *args, **kwargs)

    shutil.copyfile = copy_half_then_die

if kill_after_save:
    from fairseq import checkpoint_utils
    save_checkpoint = checkpoint_utils.save_checkpoint

    def save_then_die(cfg, trainer, *args, **kwargs):
        out = save_checkpoint(cfg, trainer, *args, **kwargs)
        if trainer.get_num_updates() >= kill_after_save:
            die()
        return out

    checkpoint_utils.save_checkpoint = save_then_die

if full_disk_at_write:
    import builtins
    sys.path.insert(0, os.path.join(os.environ["FAULT_REPO"], "tests"))
    from fault_injection import FullDisk
    real_open, writes = builtins.open, [0]

    def open_on_a_filling_disk(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        name = os.path.basename(str(file))
        if "w" in str(mode) and "checkpoint" in name:
            writes[0] += 1
            if writes[0] == full_disk_at_write:
                return FullDisk(handle, room=4096)
        return handle

    builtins.open = open_on_a_filling_disk

from fairseq_cli.train import cli_main  # noqa: E402

sys.argv = ["fairseq-train", *sys.argv[1:]]
cli_main()
'''


class FullDisk:
    """A file opened for writing on a disk with ``room`` bytes left: a write past them fails
    with ENOSPC, as on a full disk."""

    def __init__(self, handle, room: int = 0) -> None:
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()


def write_wrapper(directory: Path) -> Path:
    """:data:`WRAPPER` written into ``directory``."""
    wrapper = directory / "train_with_fault.py"
    wrapper.write_text(WRAPPER, encoding="utf-8")
    return wrapper


def wrapped_command(directory: Path, args: list) -> list:
    """The command line running fairseq-train through :data:`WRAPPER` with ``args``."""
    return [sys.executable, str(write_wrapper(directory)), *map(str, args)]


def fault_env(**faults) -> dict:
    """The environment for :func:`wrapped_command` with ``FAULT_<NAME>`` variables set."""
    env = fairseq_env()
    env["FAULT_REPO"] = str(REPO)
    env.update({f"FAULT_{name.upper()}": str(value) for name, value in faults.items()})
    return env


def run_wrapped_args(directory: Path, args: list, **faults) -> subprocess.CompletedProcess:
    """Run fairseq-train with ``args`` through :data:`WRAPPER`, with the faults set."""
    return forked_cli.run(wrapped_command(directory, args), env=fault_env(**faults),
                          capture_output=True, text=True, timeout=600)


def snapshot(directory: Path) -> dict:
    """Every file under ``directory`` (hidden ones too): relative path -> (size, sha256)."""
    return {str(path.relative_to(directory)): (path.stat().st_size,
                                               hashlib.sha256(path.read_bytes()).hexdigest())
            for path in sorted(directory.rglob("*")) if path.is_file()}


def flip_a_byte(path: Path, record_suffix: str = "data/0", offset: int = 100) -> None:
    """Flip one bit inside a record of a torch zip archive (the first tensor's storage by
    default), leaving the archive's structure intact: only its CRC-32 tells."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(record_suffix))
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:
                                                         info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length
    assert offset < info.file_size
    data[start + offset] ^= 0x10
    path.write_bytes(bytes(data))
