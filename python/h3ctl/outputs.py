"""Output files that are never overwritten by accident and never left half-written, and the signals that stop
a render.

A render reserves each output before any work: a temporary file (`.NAME.partial-PID`) is created next to the
target with O_EXCL, so an unwritable folder fails at once, not after the compute. The writers fill the temporary
file; publishing links it to the final name, which fails when a file has appeared there since the check (two
renders to one path, or a file created while the render ran): nothing is replaced unless `overwrite` was given,
and then only a regular file. A frames folder is written into a temporary folder and moved into place when
complete. On any failure or signal the temporaries are removed.

SIGINT, SIGTERM and SIGHUP all stop a render the same way (libh3 is asked to stop at its next unit of work; a
write in progress is interrupted and its temporary removed) and end as `Interrupted`, whose exit status is
128 + the signal number (130, 143, 129).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import stat
from pathlib import Path

from ._lib import H3Error

SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None),
                            getattr(signal, "SIGHUP", None)) if s is not None)
SIGNAL_WORDS = {signal.SIGINT: "interrupted"}
if hasattr(signal, "SIGTERM"):
    SIGNAL_WORDS[signal.SIGTERM] = "terminated (SIGTERM)"
if hasattr(signal, "SIGHUP"):
    SIGNAL_WORDS[signal.SIGHUP] = "hung up (SIGHUP)"


class Interrupted(KeyboardInterrupt):
    """A signal stopped the command; exit status 128 + signum."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(SIGNAL_WORDS.get(signum, f"signal {signum}"))
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


# ---- checks ------------------------------------------------------------------------------------

def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def check_target(path: str | os.PathLike, overwrite: bool) -> Path:
    """The checks of an output path, each with its own words: a directory, a file that exists (without
    overwrite), something that is not a regular file (never replaced), a parent that is a file or missing."""
    p = Path(path)
    if not p.name or p.name in (".", ".."):
        raise H3Error(f"{p}: not a file name")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None
    except OSError as e:
        raise H3Error(f"{p}: cannot be checked ({e.strerror})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise H3Error(f"{p}: is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise H3Error(f"{p}: exists and is {_kind(st.st_mode)}; only regular files are ever replaced")
        if not overwrite:
            raise H3Error(f"{p}: already exists (pass --overwrite to replace it)")
    parent = p.parent if str(p.parent) else Path(".")
    for anc in [parent, *parent.parents]:
        if anc.exists() or anc.is_symlink():
            if not anc.is_dir():
                raise H3Error(f"{p}: {anc} is a file, not a folder")
            break
    if not parent.is_dir():
        raise H3Error(f"{parent}: output folder does not exist")
    return p


def check_input(path: str | os.PathLike, label: str) -> Path:
    """An input path must name a regular file (after symlinks): a directory, a FIFO (whose read would block
    forever), a device (/dev/zero reads without end), a symlink loop or a missing file is refused with one line."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise H3Error(f"{label}: no such file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise H3Error(f"{label}: a symbolic link loop") from None
        raise H3Error(f"{label}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise H3Error(f"{label}: is {_kind(st.st_mode)}, not a regular file")
    return p


def read_capped(path: str | os.PathLike, label: str, cap: int) -> bytes:
    """The bytes of a regular file, refused past `cap` bytes (checked on the open file, not only its size)."""
    p = check_input(path, label)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise H3Error(f"{label}: cannot read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # swapped after the check
            raise H3Error(f"{label}: not a regular file")
        data = f.read(cap + 1) if st.st_size <= cap else None
    if data is None or len(data) > cap:
        raise H3Error(f"{label}: larger than {cap // (1 << 20)} MiB, more than the format can need")
    return data


# ---- exclusive temporaries, no-replace publish ---------------------------------------------------

def _renameat2_noreplace(src: str, dst: str) -> bool:
    """rename(src, dst) failing with EEXIST when dst exists (Linux renameat2). False where unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_NOREPLACE = -100, 1
    if fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), dst)


class Reserved:
    """One output: its temporary file, created now (exclusively), and its final name."""

    def __init__(self, path: str | os.PathLike, overwrite: bool):
        self.final = check_target(path, overwrite)
        self.overwrite = overwrite
        self.tmp = self.final.with_name(f".{self.final.name}.partial-{os.getpid()}")
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise H3Error(f"{self.final}: cannot be written ({e.strerror})") from None
        os.close(fd)
        self.done = False

    def publish(self) -> Path:
        """Move the finished temporary to the final name; never over a file that appeared meanwhile (unless
        overwrite, and then only over a regular file)."""
        final, tmp = self.final, self.tmp
        if self.overwrite:
            try:
                st = os.lstat(final)
            except FileNotFoundError:
                st = None
            if st is not None:
                if not stat.S_ISREG(st.st_mode):
                    raise H3Error(f"{final}: is now {_kind(st.st_mode)}; only regular files are ever replaced")
                os.replace(tmp, final)
                self.done = True
                return final
        try:
            os.link(tmp, final)
            os.unlink(tmp)
        except FileExistsError:
            raise H3Error(f"{final}: a file appeared there while rendering; it was kept and nothing was written "
                          "(pass --overwrite to replace it)") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                raise H3Error(f"{final}: cannot be written ({e.strerror})") from None
            try:  # a file system without hard links
                if not _renameat2_noreplace(str(tmp), str(final)):
                    if os.path.lexists(final):
                        raise FileExistsError(final)
                    os.rename(tmp, final)
            except FileExistsError:
                raise H3Error(f"{final}: a file appeared there while rendering; it was kept and nothing was "
                              "written (pass --overwrite to replace it)") from None
        self.done = True
        return final

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


class ReservedDir:
    """A frames folder: frames go into a temporary folder, moved into place when complete."""

    def __init__(self, path: str | os.PathLike, overwrite: bool, pattern: str = "frame-*.*"):
        self.final = Path(path)
        self.overwrite = overwrite
        try:
            st = os.lstat(self.final)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise H3Error(f"{self.final}: exists and is not a folder")
        if st is not None and any(self.final.glob(pattern)) and not overwrite:
            raise H3Error(f"{self.final}: already holds frames (pass --overwrite to replace them)")
        parent = self.final.parent if str(self.final.parent) else Path(".")
        if not parent.is_dir():
            raise H3Error(f"{parent}: {'is not a folder' if parent.exists() else 'output folder does not exist'}")
        self.tmp = parent / f".{self.final.name}.partial-{os.getpid()}"
        try:
            os.mkdir(self.tmp)
        except OSError as e:
            raise H3Error(f"{self.final}: cannot be written ({e.strerror})") from None

    def publish(self) -> Path:
        names = sorted(os.listdir(self.tmp))
        if not os.path.lexists(self.final):
            try:
                if _renameat2_noreplace(str(self.tmp), str(self.final)):
                    return self.final
            except OSError:
                pass  # it appeared: move the frames one by one below
            if not os.path.lexists(self.final):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.final)
        if not self.final.is_dir():
            raise H3Error(f"{self.final}: appeared while rendering and is not a folder; nothing was written")
        clash = [n for n in names if os.path.lexists(self.final / n)]
        for n in clash:
            st = os.lstat(self.final / n)
            if not self.overwrite or not stat.S_ISREG(st.st_mode):
                raise H3Error(f"{self.final / n}: already exists (pass --overwrite to replace frames)")
        moved = []
        try:
            for n in names:
                os.replace(self.tmp / n, self.final / n)
                moved.append(n)
        except BaseException:
            for n in moved:
                with contextlib.suppress(OSError):
                    os.unlink(self.final / n)
            raise
        with contextlib.suppress(OSError):
            os.rmdir(self.tmp)
        return self.final

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def replace_path(message: str, tmp: Path, final: Path) -> str:
    return message.replace(str(tmp), str(final))


# ---- signals -------------------------------------------------------------------------------------

class Signals:
    """SIGINT / SIGTERM / SIGHUP handlers for a command: while `computing`, the first signal asks `cancel()` to
    stop the running call (a Python exception cannot cross the C call) and is remembered; otherwise the signal
    raises Interrupted at once (a write in progress stops; its temporaries are removed by their owners)."""

    def __init__(self, cancel=None):
        self.cancel = cancel
        self.computing = True
        self.received: int | None = None
        self._previous = {}

    def _handler(self, signum, frame):
        if self.received is None:
            self.received = signum
        if self.computing and self.cancel is not None:
            self.cancel()
        else:
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise Interrupted if a signal came while computing."""
        if self.received is not None:
            raise Interrupted(self.received)

    def __enter__(self):
        for s in SIGNALS:
            try:
                self._previous[s] = signal.signal(s, self._handler)
            except (ValueError, OSError):  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        return False
