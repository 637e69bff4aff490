"""Kernel source trees: the pristine Debian source ("vanilla") and the git
work tree with our series applied as commits ("patched").

The repo's patches/ directory (git format-patch files plus a `series` file)
is the source of truth; the work tree lives in the cache and can vanish.
In the work tree, tag `ptlab-base` is the pristine source and tag
`ptlab-exported` marks the commit patches/ was last synced with; the
sha256 of patches/ at that moment is kept in .git/ptlab-patches.sha256.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import deps
from .common import PATCHES_DIR, TreeError, cache_dir, info, run, sha256_files, step, warn

BASE_TAG = "ptlab-base"
SYNC_TAG = "ptlab-exported"
GIT_ID = {"GIT_AUTHOR_NAME": "ptlab", "GIT_AUTHOR_EMAIL": "ptlab@localhost",
          "GIT_COMMITTER_NAME": "ptlab", "GIT_COMMITTER_EMAIL": "ptlab@localhost"}
KERNELS = ("vanilla", "patched")


def kernel_dir(name: str) -> Path:
    return cache_dir() / "kernels" / name


def src_dir(name: str) -> Path:
    return kernel_dir(name) / "linux"


def _git(tree: Path, *args: str, check: bool = True) -> str:
    env = {**GIT_ID, "GIT_COMMITTER_DATE": "2024-11-17T00:00:00Z"}
    return run(["git", "-C", str(tree), *args], env=env, check=check, err=TreeError,
               what=f"git {args[0]}").stdout.strip()


def source_tarball() -> tuple[Path, str]:
    """The installed linux-source tarball and the Debian package version."""
    deps.ensure_apt()
    ver = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", deps.KERNEL_SOURCE_PKG],
                         capture_output=True, text=True).stdout.strip()
    files = subprocess.run(["dpkg", "-L", deps.KERNEL_SOURCE_PKG],
                           capture_output=True, text=True).stdout.split()
    tars = [Path(f) for f in files if f.endswith(".tar.xz")]
    if not tars:
        raise TreeError(f"{deps.KERNEL_SOURCE_PKG} installs no tarball",
                        hint=f"apt-get install --reinstall {deps.KERNEL_SOURCE_PKG}")
    if ver != deps.KERNEL_SOURCE_VERSION:
        warn(f"{deps.KERNEL_SOURCE_PKG} is {ver}; the series is made for "
             f"{deps.KERNEL_SOURCE_VERSION}")
    return tars[0], ver


def kernel_version(src: Path) -> str:
    text = (src / "Makefile").read_text(errors="replace")
    get = lambda k: re.search(rf"^{k} = (\S*)", text, re.M).group(1)  # noqa: E731
    return f"{get('VERSION')}.{get('PATCHLEVEL')}.{get('SUBLEVEL')}"


def _extract(dest: Path) -> str:
    tar, debver = source_tarball()
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    step(f"extract {tar.name} ({debver}) to {dest}")
    run(["tar", "-xf", str(tar), "-C", str(tmp), "--strip-components=1"], err=TreeError,
        what="tar")
    (tmp / ".ptlab-source").write_text(f"{deps.KERNEL_SOURCE_PKG} {debver}\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return debver


def ensure_vanilla() -> Path:
    """The pristine source, extracted once."""
    src = src_dir("vanilla")
    if not (src / ".ptlab-source").exists():
        _extract(src)
    return src


# --- the series -------------------------------------------------------------

def series() -> list[Path]:
    path = PATCHES_DIR / "series"
    if not path.exists():
        return []
    names = [l.split("#")[0].strip() for l in path.read_text().splitlines()]
    out = [PATCHES_DIR / n for n in names if n]
    for p in out:
        if not p.exists():
            raise TreeError(f"patches/series names {p.name}, which does not exist")
    return out


def patches_hash() -> str:
    return sha256_files([PATCHES_DIR / "series", *series()])


def _hash_file(src: Path) -> Path:
    return src / ".git" / "ptlab-patches.sha256"


def _mark_synced(src: Path) -> None:
    _git(src, "tag", "-f", SYNC_TAG, "HEAD")
    _hash_file(src).write_text(patches_hash() + "\n")


def _apply_series(src: Path) -> None:
    pats = series()
    version = kernel_version(src)
    for i, p in enumerate(pats, 1):
        proc = run(["git", "-C", str(src), "am", "--keep-cr", str(p)], env=GIT_ID,
                   check=False, err=TreeError)
        if proc.returncode != 0:
            files = sorted(set(re.findall(r"error: (?:patch failed: )?([^:\s]+):", proc.stdout)))
            _git(src, "am", "--abort", check=False)
            raise TreeError(
                f"patch {i}/{len(pats)} {p.name} does not apply to Linux {version}"
                + (f" (in {', '.join(files)})" if files else ""),
                hint=f"the series is made for {deps.KERNEL_SOURCE_VERSION}; "
                     "rebase that patch in the work tree, then `ptlab export`",
                details=proc.stdout.strip())
    info(f"applied {len(pats)} patches on Linux {version}")


# Debian's .gitignore ignores everything at the top level ("/*", then
# "!/debian/"): in a git tree of the source package, every file the series
# adds (mm/new.c) would be ignored, silently left out of commits and so of
# patches/. The base commit drops those two lines; nothing else differs.
DEBIAN_IGNORE = ("/*", "!/debian/")


def drop_debian_ignore(gitignore: str) -> str:
    return "".join(l for l in gitignore.splitlines(keepends=True)
                   if l.strip() not in DEBIAN_IGNORE)


def _create_worktree(src: Path) -> None:
    debver = _extract(src)
    step("git: commit the pristine source as the base")
    gi = src / ".gitignore"
    if gi.exists():
        gi.write_text(drop_debian_ignore(gi.read_text()))
    _git(src, "init", "-q", "-b", "ptlab")
    _git(src, "config", "core.autocrlf", "false")
    # no gc in the background of a build: on a fresh machine `git am` of the
    # series started one, a whole CPU for minutes beside the cold build
    _git(src, "config", "gc.auto", "0")
    _git(src, "add", "-A", "-f")
    _git(src, "commit", "-q", "-m",
         f"Linux {kernel_version(src)} ({deps.KERNEL_SOURCE_PKG} {debver})")
    _git(src, "tag", BASE_TAG)


def _reset_to_base(src: Path) -> None:
    """Back to the pristine base; until the series is applied again the tree
    counts as not created (status() says so, nothing in it to lose)."""
    _hash_file(src).unlink(missing_ok=True)
    _git(src, "tag", "-d", SYNC_TAG, check=False)
    _git(src, "am", "--abort", check=False)
    _git(src, "checkout", "-q", "-f", "-B", "ptlab", BASE_TAG)
    _git(src, "clean", "-q", "-fdx")


@dataclass
class Status:
    exists: bool
    unexported: list[str]   # commits or edits that patches/ does not have
    behind: bool            # patches/ changed since the tree was synced

    @property
    def clean(self) -> bool:
        return self.exists and not self.unexported and not self.behind


def status() -> Status:
    src = src_dir("patched")
    if not (src / ".git").exists() or not _hash_file(src).exists():
        return Status(False, [], True)
    lines = []
    new = _git(src, "log", "--format=%h %s", f"{SYNC_TAG}..HEAD")
    if new:
        lines += [f"commit not exported: {l}" for l in new.splitlines()]
    gone = _git(src, "log", "--format=%h %s", f"HEAD..{SYNC_TAG}")
    if gone:
        lines += [f"exported commit no longer in the tree: {l}" for l in gone.splitlines()]
    dirty = _git(src, "status", "--porcelain", "--untracked-files=normal")
    lines += [f"uncommitted: {l}" for l in dirty.splitlines()]
    behind = _hash_file(src).read_text().strip() != patches_hash()
    gi = src / ".gitignore"
    if gi.exists() and drop_debian_ignore(gi.read_text()) != gi.read_text():
        warn(f"{src} predates the fix of Debian's .gitignore: git ignores new files "
             "there, add them with `git add -f` (or delete the tree and run `ptlab tree`)")
    return Status(True, lines, behind)


def ensure_patched(force: bool = False) -> Path:
    """Create the work tree, or bring it in line with patches/.

    A tree holding work that is not in patches/ is left alone (the caller
    builds it as it is) unless `force`, which first saves that work on a
    branch so nothing is lost."""
    src = src_dir("patched")
    st = status()
    if not st.exists:
        if (src / ".git").exists() and _git(src, "tag", "-l", BASE_TAG, check=False):
            step("work tree: apply the series")     # an earlier attempt stopped half-way
            _reset_to_base(src)
        else:
            _create_worktree(src)
        _apply_series(src)
        _mark_synced(src)
        return src
    if st.unexported:
        if not force:
            warn("the work tree has work that is not in patches/; using it as it is:")
            for l in st.unexported[:10]:
                info(l)
            return src
        branch = f"ptlab-saved-{time.strftime('%Y%m%d-%H%M%S')}"
        _git(src, "add", "-A")
        _git(src, "commit", "-q", "-m", "ptlab: uncommitted work saved", check=False)
        _git(src, "branch", branch)
        warn(f"work not in patches/ saved on branch {branch} of {src}")
    elif not st.behind:
        return src
    step("work tree: re-apply patches/")
    _reset_to_base(src)
    _apply_series(src)
    _mark_synced(src)
    return src


def export() -> list[Path]:
    """Write the work tree's commits over the base to patches/."""
    src = src_dir("patched")
    if not (src / ".git").exists():
        raise TreeError("no work tree yet", hint="ptlab tree")
    dirty = _git(src, "status", "--porcelain", "--untracked-files=normal")
    if dirty:
        raise TreeError("the work tree has uncommitted edits; commit them first",
                        details=dirty)
    cover = PATCHES_DIR / COVER_LETTER
    kept = cover_letter_parts(cover.read_text()) if cover.exists() else None
    if cover.exists() and kept is None and not is_placeholder_letter(cover.read_text()):
        raise TreeError(f"cannot read the subject and text of {cover}",
                        hint="keep its Subject: [...] line and the shortlog "
                             "(\"ptlab (N):\" then indented lines) that export wrote")
    for p in series():
        p.unlink()
    PATCHES_DIR.mkdir(exist_ok=True)
    out = _git(src, "format-patch", "--zero-commit", "--no-signature", "--cover-letter",
               "-o", str(PATCHES_DIR), f"{BASE_TAG}..HEAD")
    files = [Path(l) for l in out.splitlines() if l.strip() and Path(l).name != COVER_LETTER]
    if files:
        # the same date on every export: the letter changes when the series does
        date = _git(src, "log", "-1", "--format=%aD").strip()
        cover.write_text(fill_cover_letter(cover.read_text(), kept, date))
    (PATCHES_DIR / "series").write_text(
        "# applied in this order on linux-source-6.12 (see README)\n"
        + "".join(f"{f.name}\n" for f in files))
    _mark_synced(src)
    return files


COVER_LETTER = "0000-cover-letter.patch"
_SUBJECT_PLACEHOLDER = "*** SUBJECT HERE ***"
_BLURB_PLACEHOLDER = "*** BLURB HERE ***"


def _letter_fields(text: str) -> tuple[str, str] | None:
    head, sep, body = text.partition("\n\n")
    # "[PATCH 00/37]", "[PATCH v2 00/37]", "[RFC PATCH 00/37]"...; folded lines
    m = re.search(r"^Subject: \[[^\]]*\] (.*(?:\n[ \t].*)*)", head, re.M)
    if not sep or not m:
        return None
    subject = " ".join(m.group(1).split())
    # the shortlog: the last "<author> (<count>):" line followed by indented
    # subjects (a blurb line of that shape before it stays in the blurb)
    ends = list(re.finditer(r"^\S.* \(\d+\):\n(?=  \S)", body, re.M))
    blurb = (body[:ends[-1].start()] if ends else body).strip("\n")
    return subject, blurb


def is_placeholder_letter(text: str) -> bool:
    return _letter_fields(text) == (_SUBJECT_PLACEHOLDER, _BLURB_PLACEHOLDER)


def cover_letter_parts(text: str) -> tuple[str, str] | None:
    """The subject (without its "[PATCH 00/NN]") and the blurb of a cover
    letter that format-patch wrote and a person filled in: what export keeps;
    the shortlog and diffstat after the blurb it writes anew. None for
    format-patch's placeholders, or a letter it cannot read."""
    got = _letter_fields(text)
    if got is None or got == (_SUBJECT_PLACEHOLDER, _BLURB_PLACEHOLDER):
        return None
    return got


def fill_cover_letter(text: str, kept: tuple[str, str] | None, date: str) -> str:
    """format-patch's cover letter with the kept subject and blurb, and `date`"""
    text = re.sub(r"^Date: .*$", lambda _: f"Date: {date}", text, count=1, flags=re.M)
    if kept:
        subject, blurb = kept
        text = text.replace(_SUBJECT_PLACEHOLDER, subject, 1)
        text = text.replace(_BLURB_PLACEHOLDER, blurb, 1)
    return text


# --- kernels by name, for bench's --a and --b --------------------------

def resolve_kernel(spec: str) -> tuple[str, Path]:
    """'vanilla', 'patched', or a commit of the work tree (a series revision)."""
    if spec == "vanilla":
        return spec, ensure_vanilla()
    patched = ensure_patched()
    if spec == "patched":
        return spec, patched
    sha = subprocess.run(["git", "-C", str(patched), "rev-parse", "--short=12",
                          f"{spec}^{{commit}}"], capture_output=True, text=True).stdout.strip()
    if not sha:
        raise TreeError(f"{spec!r} is neither vanilla, patched nor a commit of the work tree",
                       hint=f"git -C {patched} log --oneline {BASE_TAG}..")
    name = f"rev-{sha}"
    src = src_dir(name)
    if not (src / ".git").exists():
        step(f"work tree for {spec} ({sha}) in {src}")
        src.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(patched), "worktree", "add", "-f", "--detach",
                        str(src), sha], check=True, capture_output=True)
    return name, src


def describe(name: str, src: Path) -> str:
    if name == "vanilla":
        return f"vanilla {kernel_version(src)}"
    desc = subprocess.run(["git", "-C", str(src), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True).stdout.strip()
    n = subprocess.run(["git", "-C", str(src), "rev-list", "--count", f"{BASE_TAG}..HEAD"],
                       capture_output=True, text=True).stdout.strip()
    return f"{kernel_version(src)} + {n} patches (HEAD {desc})"
