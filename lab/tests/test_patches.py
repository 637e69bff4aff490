"""Checks on the series itself (patches/*.patch) that no kernel build shows.

VM_BUG_ON*() and VM_WARN_ON*() do not evaluate their condition without
CONFIG_DEBUG_VM (BUILD_BUG_ON_INVALID()): a side effect inside one happens
on the debug kernel and never on the perf kernel.  0006 counted migration
entries inside VM_WARN_ON_ONCE_FOLIO(), so the perf kernel's count stayed 0
and its restore walks stopped after the first VMA (issue 10, item 0).
"""
import re

from lab import tree
from lab.common import PATCHES_DIR

_MACRO = re.compile(r"\bVM_(?:BUG|WARN)_ON\w*\s*\(")
# calls and operators that change state
_EFFECT = re.compile(r"(\+\+|--|[^=!<>]=[^=]|\b\w*(?:_return|_inc|_dec|_add|_sub|xchg|"
                     r"test_and_\w+|_and_test|_fetch_\w*)\s*\()")


def _added_code(patch: str) -> list[tuple[int, str]]:
    return [(i, l[1:]) for i, l in enumerate(patch.splitlines(), 1)
            if l.startswith("+") and not l.startswith("+++")]


def debug_macro_side_effects(patch: str) -> list[str]:
    """The added VM_BUG_ON*()/VM_WARN_ON*() whose arguments change state."""
    lines = _added_code(patch)
    found = []
    for k, (no, line) in enumerate(lines):
        m = _MACRO.search(line)
        if not m:
            continue
        text, depth, j = line[m.end():], 1, k
        while True:
            for c in text:
                depth += (c == "(") - (c == ")")
            if depth <= 0 or j + 1 >= len(lines) or j - k > 10:
                break
            j += 1
            text = lines[j][1]
            line += " " + text.strip()
        args = line[m.end():]
        if _EFFECT.search(args):
            found.append(f"line {no}: {line.strip()}")
    return found


def test_the_checker_finds_what_it_is_for():
    bad = ("+\tVM_WARN_ON_ONCE_FOLIO(atomic_long_add_return(nr, &mec->nr) < 0,\n"
           "+\t\t\t      folio);\n+\tVM_BUG_ON(x++);\n")
    good = ("+\tVM_WARN_ON_ONCE_FOLIO(left < 0, folio);\n"
            "+\tVM_WARN_ON_ONCE(!pmd_same(pmdval, pmdp_get(pmd)));\n"
            "+\tVM_BUG_ON(a == b || c != d || e <= f);\n")
    assert len(debug_macro_side_effects(bad)) == 2
    assert debug_macro_side_effects(good) == []


def test_no_side_effects_in_debug_macros():
    found = {p.name: debug_macro_side_effects(p.read_text())
             for p in sorted(PATCHES_DIR.glob("*.patch"))}
    assert not {k: v for k, v in found.items() if v}


def test_the_cover_letter_is_filled_in_and_current():
    """`ptlab export` writes it: its shortlog names the series' patches"""
    text = (PATCHES_DIR / tree.COVER_LETTER).read_text()
    assert tree.cover_letter_parts(text), "the subject or blurb is a placeholder"
    subjects = []
    for p in tree.series():
        m = re.search(r"^Subject: \[PATCH \d+/(\d+)\] (.*(?:\n .*)*)", p.read_text(), re.M)
        assert m, p.name
        subjects.append(" ".join(m.group(2).split()))
    assert f"[PATCH 00/{len(subjects):02d}]" in text or f"[PATCH 00/{len(subjects)}]" in text
    shortlog = [" ".join(l.split()) for l in text.splitlines() if l.startswith("  ")]
    # the shortlog wraps long subjects: compare their starts
    starts = [s for s in shortlog if not s.startswith(("...", "|"))]
    for sub in subjects:
        assert any(sub.startswith(s[:40]) or s.startswith(sub[:40]) for s in starts), sub


def test_message_findings():
    from lab import check
    good = ("Subject: [PATCH 01/02] mm: x\n\nWhy.\n\nFixes: 29a22b9e08d7 (\"mm: handle userfaults "
            "under VMA lock\")\nSigned-off-by: A <a@b>\n---\n mm/x.c | 1 +\n")
    assert check.message_findings("p", good) == []
    bad = good.replace("29a22b9e08d7", "29a22b9").replace("Signed-off-by: A <a@b>\n", "")
    assert [f.what.split(",")[0] for f in check.message_findings("p", bad)] == [
        "no Signed-off-by", "malformed tag"]
    # a Fixes: line in the diff is not the message's
    assert check.message_findings("p", good + "+Fixes: nothing\n") == []


def test_every_patch_message_is_clean():
    from lab import check
    found = [f for p in tree.series() for f in check.message_findings(p.name, p.read_text())]
    assert not found


def test_maintainers_coverage():
    from lab import check
    pats = ["mm/", "include/linux/mm_*.h", "include/linux/cow_pte.h"]
    assert check.covered_by_maintainers("mm/pt_reclaim.c", pats)
    assert check.covered_by_maintainers("include/linux/mm_types.h", pats)
    assert check.covered_by_maintainers("include/linux/cow_pte.h", pats)
    assert not check.covered_by_maintainers("include/linux/pt_reclaim.h", pats)
    patch = "diff --git a/mm/x.c b/mm/x.c\nnew file mode 100644\n--- /dev/null\n"
    assert check.new_files(patch) == ["mm/x.c"]


def test_maintainers_globs_stay_in_one_directory():
    from lab import check
    pats = ["drivers/*/foo.c", "include/linux/page[-_]*"]
    assert check.covered_by_maintainers("drivers/a/foo.c", pats)
    assert not check.covered_by_maintainers("drivers/a/b/foo.c", pats)
    assert check.covered_by_maintainers("include/linux/page-flags.h", pats)


def test_check_builds_each_commit_and_names_the_patch_that_does_not(tmp_path, monkeypatch):
    """`ptlab check --builds`: each commit of ptlab-base..HEAD built in turn in
    a worktree; a failure is a finding of that commit's patch; a commit that
    touches the mm selftests has them built too"""
    import subprocess
    from lab import build, check, tree
    from lab.common import BuildError
    src = tmp_path / "src"
    src.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(src), *a], check=True,  # noqa: E731
                                    capture_output=True, env={**tree.GIT_ID, "HOME": "/"})
    git("init", "-q", "-b", "ptlab")
    (src / "f").write_text("0")
    git("add", "f"), git("commit", "-qm", "base"), git("tag", tree.BASE_TAG)
    for n, path in ((1, "mm/a.c"), (2, "tools/testing/selftests/mm/t.c"), (3, "mm/b.c")):
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(str(n))
        git("add", path), git("commit", "-qm", f"patch {n}")
    monkeypatch.setattr(tree, "src_dir", lambda name: src)
    monkeypatch.setattr(tree, "kernel_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(tree, "status", lambda: tree.Status(True, [], False))
    monkeypatch.setattr(tree, "series", lambda: [tmp_path / f"000{n}-p.patch" for n in (1, 2, 3)])
    seen, selftests = [], []

    def fake_build(wt, kdir, profile):
        seen.append((wt / "mm" / "b.c").exists())
        if len(seen) == 3:
            raise BuildError("make failed", details="mm/b.c: error")
    monkeypatch.setattr(build, "build_kernel", fake_build)
    monkeypatch.setattr(build, "build_selftests", lambda wt, kdir: selftests.append(len(seen)))
    found = check.build_each_commit("debug")
    assert seen == [False, False, True] and selftests == [2]
    assert [f.patch for f in found] == ["0003-p.patch"] and "mm/b.c: error" in found[0].what
