"""The base commit of the work tree must track new files of the series."""
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
