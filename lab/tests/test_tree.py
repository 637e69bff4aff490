"""The work tree: its base commit tracks new files; export keeps the cover letter."""
from lab import tree

DEBIAN_GITIGNORE = """# Kdevelop4
*.kdev4

#
# Debian packaging: ignore everything at the top level, since it isn't
# included in our repository
#
/*
!/debian/
"""


def test_drop_debian_ignore_keeps_the_rest():
    out = tree.drop_debian_ignore(DEBIAN_GITIGNORE)
    assert "/*\n" not in out and "!/debian/" not in out
    assert "*.kdev4\n" in out


COVER = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: ptlab <ptlab@localhost>
Date: Sat, 28 Nov 2026 08:00:00 +0000
Subject: [PATCH 00/02] *** SUBJECT HERE ***

*** BLURB HERE ***

ptlab (2):
  mm: one
  mm: two

 mm/memory.c | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

base-commit: 0123
"""


def test_export_keeps_the_subject_and_blurb():
    assert tree.cover_letter_parts(COVER) is None     # format-patch's placeholders
    filled = COVER.replace("*** SUBJECT HERE ***", "mm: page tables,\n cheap").replace(
        "*** BLURB HERE ***", "Why.\n\nptlab (n): not a shortlog line")
    subject, blurb = tree.cover_letter_parts(filled)
    assert subject == "mm: page tables, cheap"
    assert blurb == "Why.\n\nptlab (n): not a shortlog line"
    fresh = COVER.replace("(2):\n  mm: one", "(3):\n  mm: zero\n  mm: one")
    out = tree.fill_cover_letter(fresh, (subject, blurb), "Mon, 23 Nov 2026 18:48:08 +0000")
    assert "Subject: [PATCH 00/02] mm: page tables, cheap\n" in out
    assert "\nWhy.\n\nptlab (n): not a shortlog line\n\nptlab (3):\n  mm: zero\n" in out
    assert "Date: Mon, 23 Nov 2026 18:48:08 +0000\n" in out
    assert tree.cover_letter_parts(out) == (subject, blurb)


def test_a_blurb_line_like_a_shortlog_header_stays_and_prefixes_are_kept():
    filled = COVER.replace("[PATCH 00/02] *** SUBJECT HERE ***", "[RFC PATCH v2 00/02] mm: x,\n\tcheap").replace(
        "*** BLURB HERE ***", "Intro.\n\nBenchmarks (3):\n- a\n\nEnd.")
    assert tree.cover_letter_parts(filled) == (
        "mm: x, cheap", "Intro.\n\nBenchmarks (3):\n- a\n\nEnd.")
    assert tree.is_placeholder_letter(COVER)
