"""Paths, errors, subprocess and terminal helpers shared by every stage."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "config"
PATCHES_DIR = REPO / "patches"
BENCH_DIR = REPO / "bench"
RESULTS_DIR = REPO / "results"
BASELINE_DIR = REPO / "baseline"


class LabError(Exception):
    """An error the user can act on: printed as one message plus a hint."""

    def __init__(self, message: str, hint: str = "", details: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details


class SetupError(LabError):
    pass


class TreeError(LabError):
    pass


class ConfigError(LabError):
    pass


class BuildError(LabError):
    pass


class GuestError(LabError):
    pass


def cache_dir() -> Path:
    """Where kernel trees, build directories, ccache and runs live."""
    env = os.environ.get("PTLAB_CACHE")
    path = Path(env) if env else Path.home() / ".cache" / "ptlab"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LabError(f"cannot use {path} as the lab's cache directory: {e.strerror}",
                       hint="set PTLAB_CACHE to a directory (it is created if missing)")
    return path.resolve()


def jobs() -> int:
    return os.cpu_count() or 2


_T0 = time.monotonic()


def elapsed() -> str:
    s = int(time.monotonic() - _T0)
    return f"{s // 60:2d}:{s % 60:02d}"


def step(msg: str) -> None:
    """A top-level stage, e.g. "build patched (debug)"."""
    print(f"[{elapsed()}] {msg}", flush=True)


def info(msg: str) -> None:
    print(f"        {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"        warning: {msg}", flush=True)


class Progress:
    """One progress line that rewrites itself on a terminal and prints
    sparingly (every `every` seconds) when the output is a log file."""

    def __init__(self, every: float = 30.0):
        self.tty = sys.stdout.isatty()
        self.every = 1.0 if self.tty else every
        self.last = 0.0
        self.shown = False

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        line = f"[{elapsed()}]   {text}"
        if self.tty:
            print(f"\r\033[K{line}", end="", flush=True)
            self.shown = True
        else:
            print(line, flush=True)

    def done(self) -> None:
        if self.tty and self.shown:
            print(flush=True)
        self.shown = False


def run(cmd: list[str], cwd: Path | None = None, env: dict | None = None,
        check: bool = True, capture: bool = True,
        err: type[LabError] = LabError, what: str = "") -> subprocess.CompletedProcess:
    """Run a command; on failure raise `err` with the tail of its output."""
    full_env = None if env is None else {**os.environ, **env}
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)
    if check and proc.returncode != 0:
        out = (proc.stdout or "").strip().splitlines()
        raise err(f"{what or cmd[0]} failed (exit {proc.returncode})",
                  details="\n".join(out[-30:]) + f"\n$ {' '.join(map(str, cmd))}")
    return proc


def sha256_files(paths: list[Path], extra: str = "") -> str:
    import hashlib
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(str(p.name).encode() + b"\0")
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()
