"""What a run worker prints goes to a log file; the command line keeps one line per error.

A batch run in-process writes a lot to the terminal that is not for its user: Dagster's console
logger prints every ERROR event with its stack trace (97 lines for one refused step), its compute-log
capture mirrors everything through a ``tail`` subprocess, and a failing provider adds retries and
chained causes (over 1,000 lines). :func:`output_to` sends all of it (file descriptors 1 and 2,
so child processes and C-level writes too) to a file for the duration; what is meant for the user
(progress, the one error line) is written to a stream opened on the real stderr beforehand
(:func:`user_stream`). :func:`echo_worker_output` (``--verbose``) also copies everything to the
real stderr.

:class:`ClosedPipeSafe` is the other half of a well-behaved command-line tool: once the reader of
stdout or stderr is gone (``job list | head -3``), writes stop silently instead of ending in a
``BrokenPipeError`` traceback, and the command still finishes its work and its exit code.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, cast

#: Module-wide: the CLI's ``--verbose`` turns it on once, for every batch this process runs.
_echo = False


def echo_worker_output(on: bool) -> None:
    """Also copy what :func:`output_to` routes to its file to the real stderr (``--verbose``)."""
    global _echo
    _echo = on


def user_stream() -> TextIO:
    """A line-buffered stream on the current stderr that keeps reaching it while :func:`output_to`
    has redirected descriptor 2 (the caller closes it)."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")


@contextmanager
def output_to(path: Path, title: str) -> Iterator[None]:
    """Route this process's stdout and stderr to ``path`` (appended) while the block runs.

    Restores both descriptors afterwards, whatever happened in the block.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(log_fd, f"=== {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {title} (pid {os.getpid()}) ===\n".encode())
    tee: threading.Thread | None = None
    pipe_write = -1
    if _echo:
        pipe_read, pipe_write = os.pipe()
        tee = threading.Thread(target=_tee, args=(pipe_read, (log_fd, saved_err)), daemon=True)
        tee.start()
    target = pipe_write if _echo else log_fd
    os.dup2(target, 1)
    os.dup2(target, 2)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        if tee is not None:
            os.close(pipe_write)  # the last write end of the pipe: the tee reads to its end and stops
            tee.join(timeout=5)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)


def _tee(source: int, targets: tuple[int, ...]) -> None:
    with os.fdopen(source, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            for fd in targets:
                with suppress(OSError):
                    os.write(fd, chunk)


class ClosedPipeSafe:
    """A text stream whose writes stop, silently, once its reader has gone away (EPIPE).

    The descriptor is then pointed at /dev/null, so the interpreter's final flush does not print
    "Exception ignored ... BrokenPipeError" either.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    @classmethod
    def install(cls) -> None:
        """Wrap ``sys.stdout`` and ``sys.stderr`` (idempotent)."""
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, cls):
                setattr(sys, name, cast(TextIO, cls(stream)))

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.broken = True
        with suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
