"""Build details that the tests' results depend on."""
import subprocess

import pytest

from lab import build


def test_a_static_program_is_told_from_a_static_pie(tmp_path):
    """Our programs are static PIEs (build.STATIC): a static non-PIE's heap
    can start on an address a test maps at (khugepaged's 1 GiB)."""
    c = tmp_path / "p.c"
    c.write_text("int main(void) { return 0; }\n")
    (tmp_path / "script.sh").write_text("#!/bin/sh\n")
    for flag, name in (("-static", "fixed"), (build.STATIC, "pie")):
        subprocess.run(["gcc", flag, str(c), "-o", str(tmp_path / name)], check=True)
    assert build.elf_type(tmp_path / "fixed") == 2
    assert build.is_pie(tmp_path / "pie")
    assert build.elf_type(tmp_path / "script.sh") is None
    build._check_pie([tmp_path / "pie", tmp_path / "script.sh"])
    with pytest.raises(build.BuildError, match="fixed"):
        build._check_pie(list(tmp_path.iterdir()))
