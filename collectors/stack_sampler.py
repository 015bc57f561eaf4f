"""A low-rate sample of the training thread's Python stack, taken from a background thread.

Every ``1 / hz`` seconds the ``perftracker-stacks`` thread looks up the training
thread's current frame (``sys._current_frames()``) and counts two frames:

* the innermost frame (kind ``INNERMOST``), whatever code it is in;
* the innermost frame in *user* code (kind ``WHERE``): the first frame, walking out,
  whose file is not in torch, perftracker or the standard library. "Where the rank's
  time goes" in the user's own terms (``train.py:88 step``).

Never walk another thread's frames in Python code. Walking the training thread's frame
objects (``f_back``) after that thread ran again can crash CPython 3.11 (a frame's
``previous`` link left dangling: python/cpython#97752, #99110, and profilers built the
same way still crashed on 3.11.5, getsentry/sentry-python#2386). A walk written as a
Python loop can hand the GIL over at any backward jump once the training thread has
waited the switch interval, which a loaded host makes likely. So :func:`thread_chain`
reads the chain in one run of C code (``list.extend`` over ``map(attrgetter(...))`` of
``itertools.accumulate(..., getattr)``, ``sys._current_frames()`` called lazily inside):
no bytecode runs from the lookup to the last ``f_back``, so the interpreter never checks
whether to hand the GIL over, and no frame object outlives the read. (Only a garbage
collection started by allocating a frame object could run Python finalizers in between.)
No stack is read while a module is being imported (:func:`importing`): the one sampler
crash caught with its stacks happened during ``import torch``, with the walk already in C.

Counts are kept per (file, line, function) and handed out once per flush
(:meth:`StackSampler.take`). Bad input is counted and skipped: a thread that exited
(no frame), a file name that is not valid UTF-8 (escaped, counted), any exception.
The cost per sample is measured by ``benchmarks``-style timing in the unit tests and
reported in docs/collectors.md.
"""

from __future__ import annotations

import importlib._bootstrap as _bootstrap  # type: ignore[import-not-found]
import linecache
import os
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import accumulate, chain, repeat, starmap
from operator import attrgetter, methodcaller
from types import CodeType, FrameType
from typing import Any

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
LIBRARY_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}perftracker{os.sep}", f"{os.sep}perftracker_ml{os.sep}")


def user_parts(setting: str) -> tuple[str, ...]:
    """The ``collector.user_code_paths`` setting as path fragments (blank entries dropped)."""
    return tuple(p.strip() for p in setting.split(",") if p.strip())


def is_library(filename: str, roots: tuple[str, ...] = LIBRARY_ROOTS, user: tuple[str, ...] = ()) -> bool:
    """True for torch, perftracker and standard-library files (and ``<frozen ...>``); a file whose
    path holds one of ``user`` (``collector.user_code_paths``) is the job's own code wherever it lies."""
    if filename.startswith("<"):
        return True
    if any(part in filename for part in user):
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


_CODE_AND_LINE = attrgetter("f_code", "f_lineno")
_GETATTR: Callable[[Any, Any], Any] = getattr  # the builtin, typed for accumulate
CodeLine = tuple[CodeType, "int | None"]


def _read_chain(top: Iterator[FrameType | None], depth: int) -> list[CodeLine]:
    """``(code, line)`` of the frame ``top`` yields and its callers, innermost first, at most
    ``depth``, read in one run of C code (see the module's docstring): ``accumulate`` applies
    ``getattr(f, "f_back")`` and ``map`` reads each frame's code and line, until the
    outermost frame's ``None`` (or a missing thread's) makes ``attrgetter`` raise;
    ``list.extend`` keeps what it had appended before that."""
    stack: list[CodeLine] = []
    try:
        stack.extend(map(_CODE_AND_LINE, accumulate(chain(top, repeat("f_back", depth - 1)), _GETATTR)))
    except AttributeError:  # None.f_code: past the outermost frame
        pass
    return stack


def frame_chain(frame: FrameType, depth: int = MAX_DEPTH) -> list[CodeLine]:
    """``(code, line)`` of ``frame`` and its callers, innermost first (the calling thread's
    own frames, or frames already taken from another thread)."""
    return _read_chain(iter((frame,)), depth)


def thread_chain(ident: int, depth: int = MAX_DEPTH) -> list[CodeLine]:
    """``(code, line)`` of thread ``ident``'s stack, innermost first ([]: no such thread).
    ``sys._current_frames()`` is called lazily inside the same run of C code that walks
    ``f_back``, so no bytecode runs between taking the thread's frame and the last step."""
    top = map(methodcaller("get", ident), starmap(sys._current_frames, ((),)))
    return _read_chain(top, depth)


def importing() -> bool:
    """Whether some thread is importing a module now (importlib holds a per-module lock for
    each import in progress, ``importlib._bootstrap._module_locks``; False where that is
    not there). The sampler does not read stacks then: walking a thread's frames while it is
    inside an import can crash CPython 3.11 even with the walk in C (docs/detection.md,
    decisions: "no stack read during imports"). Imports are start-up (and rare lazy ones),
    not the training steps the samples are for."""
    return bool(getattr(_bootstrap, "_module_locks", None))


def classify(stack: list[CodeLine], user: dict[CodeType, bool],
             parts: tuple[str, ...] = ()) -> tuple[Frame, Frame | None]:
    """The innermost frame and the innermost user frame (None: none in ``stack``) as plain
    tuples. ``user`` caches the per-code decision; ``parts``: :func:`is_library`'s ``user``."""
    code, line = stack[0]
    innermost = (code.co_filename, line or 0, code.co_name)
    for code, line in stack:
        is_user = user.get(code)
        if is_user is None:
            is_user = user[code] = not is_library(code.co_filename, user=parts)
        if is_user:
            return innermost, (code.co_filename, line or 0, code.co_name)
    return innermost, None


def read_frames(frame: FrameType, user: dict[CodeType, bool]) -> tuple[Frame, Frame | None]:
    """:func:`classify` of :func:`frame_chain` (``frame`` and at most MAX_DEPTH callers)."""
    return classify(frame_chain(frame), user)


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

    def __init__(self, ident: int, hz: float, user_code: tuple[str, ...] = ()):
        super().__init__(name="perftracker-stacks", daemon=True)
        self.target = ident
        self.hz = hz
        self.user_code = user_code
        self.errors = 0
        self._counts = StackCounts()
        self._user: dict[CodeType, bool] = {}  # per-code "is user code", sampler thread only
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def sample_once(self) -> None:
        """One sample; never raises (a vanished thread is counted and skipped, and so is a
        sample while a module is being imported: see :func:`importing`)."""
        try:
            if importing():
                with self._lock:
                    self._counts.skipped["importing"] += 1
                return
            stack = thread_chain(self.target)
            sample = classify(stack, self._user, self.user_code) if stack else None
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
