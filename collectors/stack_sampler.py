"""A low-rate sample of the training thread's Python stack, taken from a background thread.

Every ``1 / hz`` seconds the ``perftracker-stacks`` thread looks up the training
thread's current frame (``sys._current_frames()``) and counts two frames:

* the innermost frame (kind ``INNERMOST``), whatever code it is in;
* the innermost frame in *user* code (kind ``WHERE``): the first frame, walking out,
  whose file is not in torch, perftracker or the standard library. "Where the rank's
  time goes" in the user's own terms (``train.py:88 step``).

Never touch another thread's frames after letting it run. Walking the training
thread's frame objects (``f_back``) after that thread ran again can crash CPython 3.11
(a suspended generator's frame keeps a dangling ``previous``: python/cpython#111363,
#99110; ranks died of SIGSEGV here when the sampler blocked on its lock between
``sys._current_frames()`` and the walk, so the training thread ran in between). So
:func:`read_frames` copies the two frames out as plain tuples right after
``sys._current_frames()``, in a few microseconds of pure attribute reads with no call
that could release the GIL (the interpreter hands the GIL over only after the 5 ms
switch interval), and the frame objects are dropped before anything else happens.

Counts are kept per (file, line, function) and handed out once per flush
(:meth:`StackSampler.take`). Bad input is counted and skipped: a thread that exited
(no frame), a file name that is not valid UTF-8 (escaped, counted), any exception.
The cost per sample is measured by ``benchmarks``-style timing in the unit tests and
reported in docs/collectors.md.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from collections import Counter
from types import CodeType, FrameType

INNERMOST = 0
WHERE = 1
MAX_DEPTH = 256  # frames walked at most per sample
MAX_FRAMES = 512  # distinct (frame, kind) keys kept per flush; the rest are counted as overflow

Frame = tuple[str, int, str]  # (file, line, function)


PACKAGE_PARTS = ("collectors", "schemas", "streams", "sinks", "deploy", "grafana")


def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths().get("stdlib", ""), sysconfig.get_paths().get("platstdlib", "")}
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # perftracker itself
    ours = {os.path.join(package, sub) + os.sep for sub in PACKAGE_PARTS}
    return tuple(sorted(r for r in roots | ours if r))


LIBRARY_ROOTS = _library_roots()
LIBRARY_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}perftracker{os.sep}")


# the demo's training script and fault injector stand in for a user's code
USER_PARTS = (f"{os.sep}deploy{os.sep}demo{os.sep}",)


def is_library(filename: str, roots: tuple[str, ...] = LIBRARY_ROOTS) -> bool:
    """True for torch, perftracker and standard-library files (and ``<frozen ...>``); the
    demo's training code (``deploy/demo``) counts as user code."""
    if filename.startswith("<"):
        return True
    if any(part in filename for part in USER_PARTS):
        return False
    if any(part in filename for part in LIBRARY_PARTS):
        return True
    return any(filename.startswith(r) for r in roots) and "site-packages" not in filename


def safe_text(text: str) -> tuple[str, bool]:
    """``text`` as valid UTF-8 (undecodable bytes escaped), and whether it had to be escaped."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8"), True


def _source(file: str, line: int) -> str:
    """The stripped text of ``file``'s line ``line`` ('' when unreadable), at most 120 characters."""
    try:
        return safe_text(linecache.getline(file, line).strip()[:120])[0]
    except Exception:  # noqa: BLE001 - odd files, odd encodings: no source text
        return ""


def read_frames(frame: FrameType, user: dict[CodeType, bool]) -> tuple[Frame, Frame | None]:
    """The innermost frame and the innermost user frame (None: none within MAX_DEPTH) of the
    stack whose top is ``frame``, as plain tuples. ``user`` caches the per-code decision.
    Nothing here may release the GIL (see the module's docstring)."""
    code = frame.f_code
    innermost = (code.co_filename, frame.f_lineno or 0, code.co_name)
    f: FrameType | None = frame
    depth = 0
    while f is not None and depth < MAX_DEPTH:
        code = f.f_code
        is_user = user.get(code)
        if is_user is None:
            is_user = user[code] = not is_library(code.co_filename)
        if is_user:
            return innermost, (code.co_filename, f.f_lineno or 0, code.co_name)
        f = f.f_back
        depth += 1
    return innermost, None


class StackCounts:
    """Per-flush counts of sampled frames; ``add`` is called by the sampler thread only."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[Frame, int]] = Counter()
        self.samples = 0
        self.skipped: Counter[str] = Counter()  # by reason

    def add(self, innermost: Frame, where: Frame | None) -> None:
        """Count one sample: its innermost frame and its innermost user frame (None: none)."""
        self.samples += 1
        self._count(innermost, INNERMOST)
        if where is None:
            self.skipped["no_user_frame"] += 1
        else:
            self._count(where, WHERE)

    def _count(self, key_frame: Frame, kind: int) -> None:
        key = (key_frame, kind)
        if key in self.counts or len(self.counts) < MAX_FRAMES:
            self.counts[key] += 1
        else:
            self.skipped["too_many_frames"] += 1

    def rows(self) -> list[tuple[str, int, int, int, str]]:
        """``(file function, line, kind, count, source line)`` rows, most sampled first; text made
        valid UTF-8. Runs on the sender thread (``linecache`` reads each file once)."""
        out = []
        for ((file, line, func), kind), n in self.counts.most_common():
            name, escaped = safe_text(f"{file} {func}")
            if escaped:
                self.skipped["non_utf8_name"] += 1
            out.append((name, int(line), kind, int(n), _source(file, line)))
        return out


class StackSampler(threading.Thread):
    """Samples thread ``ident`` (``target``)'s stack ``hz`` times a second until :meth:`close`."""

    def __init__(self, ident: int, hz: float):
        super().__init__(name="perftracker-stacks", daemon=True)
        self.target = ident
        self.hz = hz
        self.errors = 0
        self._counts = StackCounts()
        self._user: dict[CodeType, bool] = {}  # per-code "is user code", sampler thread only
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def sample_once(self) -> None:
        """One sample; never raises (a vanished thread is counted and skipped)."""
        try:
            frame = sys._current_frames().get(self.target)
            sample = None if frame is None else read_frames(frame, self._user)
            del frame  # before anything that could let the training thread run
            with self._lock:
                if sample is None:
                    self._counts.skipped["thread_gone"] += 1
                else:
                    self._counts.add(*sample)
        except Exception:  # noqa: BLE001 - a sampler must never disturb the process
            self.errors += 1

    def run(self) -> None:
        period = 1.0 / self.hz
        while not self._stop_event.wait(period):
            self.sample_once()

    def take(self) -> StackCounts:
        """The counts since the last call (a fresh accumulator takes over)."""
        with self._lock:
            counts, self._counts = self._counts, StackCounts()
        return counts

    def close(self) -> None:
        self._stop_event.set()
