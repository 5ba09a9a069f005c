"""Reading a kernel log as it grows: a file, ``/dev/kmsg`` or a command such as ``dmesg -w``.

Theory of operation. ``KernelLogSource`` (in ``kernel_log``) owns one tail and one parser and asks the
tail, on every read, for the complete lines that appeared since the last read. ``FileTail`` remembers its
offset and inode: a file that shrank or was replaced (logrotate) is read again from the start, and a line
still being written stays in ``partial`` until its newline arrives. ``KmsgTail`` reads ``/dev/kmsg`` one
record per non-blocking read (no dmesg binary needed, only read access; records the ring buffer overwrote
before we read them are skipped). ``CommandTail`` runs the command with a reader thread filling a queue,
so a read never blocks; a command that exited is reported and restarted on the next read (the parser then
skips the lines it replays). Errors come back as text for the source to report, never as exceptions that
stop the agent. This is the imperative shell: all I/O of the kernel log lives here.
"""

from __future__ import annotations

import contextlib
import os
import queue
import stat
import subprocess
import threading
from collections.abc import Sequence


def read_boot_time(proc_stat: str = "/proc/stat") -> float | None:
    """The kernel's boot time (unix seconds) from ``btime``; None where /proc is not readable."""
    try:
        with open(proc_stat, encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


class FileTail:
    """Reads complete new lines from a file, following truncation and rotation (new inode)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.partial = b""

    def read_lines(self) -> list[str]:
        st = os.stat(self.path)
        if self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset):
            self.offset, self.partial = 0, b""
        self.inode = st.st_ino
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
            self.offset = f.tell()
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        return [c.decode("utf-8", errors="replace") for c in complete]


class KmsgTail:
    """Reads /dev/kmsg records without blocking (one record per read; ``prio,seq,usec,flags;message``).
    Needs no dmesg binary, only read access to the device (CAP_SYSLOG in a container)."""

    def __init__(self, path: str, from_start: bool) -> None:
        self.path = path
        self.from_start = from_start
        self.fd: int | None = None

    def read_lines(self) -> list[str]:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            if not self.from_start:
                os.lseek(self.fd, 0, os.SEEK_END)
        out: list[str] = []
        while True:
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the ring buffer overwrote records we had not read: go on
                continue
            if not record:
                break
            # Continuation lines (" KEY=value" device properties) follow the message; they are not ours.
            out.append(record.decode("utf-8", errors="replace").split("\n", 1)[0])
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class CommandTail:
    """Runs ``dmesg -w`` / ``journalctl -k -f`` and collects its lines on a reader thread."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            self.lines.put(raw.decode("utf-8", errors="replace"))

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL)
        self.thread = threading.Thread(target=self._pump, args=(self.proc,), daemon=True,
                                       name="kernel-log-tail")
        self.thread.start()

    def read_lines(self) -> tuple[list[str], str | None]:
        """Lines so far, and why the command is not running (None while it runs)."""
        if self.proc is None:
            self.start()
        out: list[str] = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                break
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None and (self.thread is None or not self.thread.is_alive()):
            self.proc = None  # restarted on the next read
            return out, f"command exited with status {code}"
        return out, None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)
        self.proc = None
