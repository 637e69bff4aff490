"""`ptlab check`: the series' hygiene, as a reviewer reads it before a
posting. Every patch of patches/series passes the kernel tree's
scripts/checkpatch.pl --strict (but for the two warnings IGNORED explains),
carries a Signed-off-by, and its Fixes: tags name a commit the way
Documentation/process/submitting-patches.rst asks (12 or more hex digits,
the subject in parentheses and quotes); a new file is one that MAINTAINERS
covers. With --builds, each commit of the series is built on its own
(bisectability), in a worktree of its own."""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import build, tree
from .common import BuildError, ConfigError, TreeError, info, run, step

_FIXES = re.compile(r"^Fixes:.*$", re.M)
_FIXES_OK = re.compile(r'^Fixes: [0-9a-f]{12,40} \(".+"\)$')
_SIGNED = re.compile(r"^Signed-off-by: .+ <.+>$", re.M)


@dataclass
class Finding:
    patch: str
    what: str


def message(text: str) -> str:
    """The commit message of a format-patch file (what git am takes)"""
    return text.split("\n---\n", 1)[0]


def message_findings(name: str, text: str) -> list[Finding]:
    """What the commit message of one format-patch file lacks"""
    msg = message(text)
    out = []
    if not _SIGNED.search(msg):
        out.append(Finding(name, "no Signed-off-by"))
    for line in _FIXES.findall(msg):
        if not _FIXES_OK.match(line):
            out.append(Finding(name, f"malformed tag, want Fixes: <12+ hex> (\"subject\"): "
                                     f"{line}"))
    return out


# Two of checkpatch's warnings that this tree cannot answer as upstream's can:
# UNKNOWN_COMMIT_ID, a Fixes: commit looked up in the tree's git, which holds
# the Debian source as one commit (message_findings() checks the tag's form);
# FILE_PATH_CHANGES, "does MAINTAINERS need updating?" for every new file,
# which covered_by_maintainers() answers for each new file instead.
IGNORED = ("UNKNOWN_COMMIT_ID", "FILE_PATH_CHANGES")


def maintainers_patterns(src: Path) -> list[str]:
    """The F: entries of MAINTAINERS, a directory's with its trailing /"""
    text = (src / "MAINTAINERS").read_text(errors="replace")
    pats = re.findall(r"^F:\s+(\S+)", text, re.M)
    return [p + "/" if not p.endswith("/") and (src / p).is_dir() else p for p in pats]


def _glob_rx(pat: str) -> str:
    """A shell glob as a regex whose * and ? do not cross a /"""
    out = []
    for part in re.split(r"(\*|\?|\[[^\]]*\])", pat):
        out.append("[^/]*" if part == "*" else "[^/]" if part == "?" else
                   part if part.startswith("[") and part.endswith("]") and len(part) > 1
                   else re.escape(part))
    return "".join(out)


def covered_by_maintainers(path: str, patterns: list[str]) -> bool:
    """Whether an F: pattern of MAINTAINERS matches `path`, as get_maintainer.pl
    reads them: a directory covers its tree; a glob's * and ? stay within
    one directory level (X: exclusions and N: regexes are not looked at)"""
    for pat in patterns:
        if pat == path or (pat.endswith("/") and path.startswith(pat)):
            return True
        if any(c in pat for c in "*?["):
            if re.fullmatch(_glob_rx(pat), path):
                return True
    return False


def new_files(text: str) -> list[str]:
    return re.findall(r"^diff --git a/\S+ b/(\S+)\nnew file mode", text, re.M)


def checkpatch(src: Path, patch: Path, patterns: list[str]) -> list[Finding]:
    """checkpatch --strict on `patch`; its new files against MAINTAINERS' `patterns`"""
    # spdxcheck.py runs as `python3`: Debian's, which has ply and git
    env = {**os.environ, "PATH": "/usr/bin:/bin:" + os.environ.get("PATH", "")}
    proc = subprocess.run(["perl", "scripts/checkpatch.pl", "--strict", "-q", "--no-summary",
                           "--ignore", ",".join(IGNORED), str(patch)], cwd=src, env=env,
                          capture_output=True, text=True)
    text = proc.stdout.strip()
    # what perl or spdxcheck.py say on stderr counts only with a failure
    if proc.returncode:
        text += ("\n" + proc.stderr.strip()) if proc.stderr.strip() else ""
    out = [] if proc.returncode == 0 and not text else [
        Finding(patch.name, "checkpatch --strict:\n" + text)]
    for f in new_files(patch.read_text()):
        if not covered_by_maintainers(f, patterns):
            out.append(Finding(patch.name, f"new file {f}: no F: entry of MAINTAINERS covers it"))
    return out


def check_series(src: Path) -> list[Finding]:
    found = []
    pats = tree.series()
    patterns = maintainers_patterns(src)
    step(f"check {len(pats)} patches: checkpatch --strict, Signed-off-by, Fixes: tags")
    for p in pats:
        text = p.read_text()
        got = message_findings(p.name, text) + checkpatch(src, p, patterns)
        found += got
        fixes = _FIXES.findall(message(text))
        info(f"{p.name}: {'ok' if not got else 'NOT ok'}"
             + (f" ({'; '.join(fixes)})" if fixes else ""))
    return found


EACH_COMMIT = "each-commit"     # kernels/each-commit: the worktree of --builds


def build_each_commit(profile: str, first: int = 1) -> list[Finding]:
    """Each commit of the series built on its own with `profile`: a detached
    worktree of the work tree's git (kernels/each-commit/linux) checked out
    at each commit in turn, one build directory, so each build is
    incremental (and ccache has the rest). The options of config/features.config
    that a commit's Kconfig does not declare yet are left out. A commit that
    touches the mm selftests has them built too. `first` (1-based) resumes
    an interrupted run at that patch."""
    src = tree.src_dir("patched")
    st = tree.status()
    if not st.clean:
        raise TreeError("the work tree and patches/ differ: --builds builds the work "
                        "tree's commits, which must be the series",
                        hint="ptlab export (or ptlab tree), then ptlab check --builds")
    log = subprocess.run(["git", "-C", str(src), "log", "--reverse", "--format=%H",
                          f"{tree.BASE_TAG}..HEAD"], capture_output=True, text=True,
                         check=True).stdout.split()
    pats = tree.series()
    if len(log) != len(pats):
        raise TreeError(f"{len(log)} commits in the work tree, {len(pats)} patches in "
                        "patches/series", hint="ptlab tree --force re-applies the series")
    kdir = tree.kernel_dir(EACH_COMMIT)
    wt = kdir / "linux"
    if not (wt / ".git").exists():
        kdir.mkdir(parents=True, exist_ok=True)
        run(["git", "-C", str(src), "worktree", "prune"], err=TreeError)
        run(["git", "-C", str(src), "worktree", "add", "-q", "--detach", str(wt),
             tree.BASE_TAG], err=TreeError, what=f"git worktree add {wt}")
    found = []
    step(f"build each of {len(log) - first + 1} commits on its own ({profile} profile) in {wt}")
    for n, (sha, patch) in enumerate(zip(log, pats), 1):
        if n < first:
            continue
        subprocess.run(["git", "-C", str(wt), "checkout", "-q", "--detach", sha], check=True)
        t0 = time.monotonic()
        touched = subprocess.run(["git", "-C", str(wt), "show", "--format=", "--name-only",
                                  sha], capture_output=True, text=True).stdout.split()
        try:
            build.build_kernel(wt, kdir, profile)
            if any(f.startswith("tools/testing/selftests/mm/") for f in touched):
                build.build_selftests(wt, kdir)     # what the kernel's build leaves out
            info(f"{n}/{len(log)} {patch.name}: builds ({time.monotonic() - t0:.0f} s)")
        except (BuildError, ConfigError) as e:
            found.append(Finding(patch.name, f"does not build on its own ({profile}): {e}"
                                 + (f"\n{e.details}" if getattr(e, "details", "") else "")))
            info(f"{n}/{len(log)} {patch.name}: DOES NOT BUILD")
    return found
