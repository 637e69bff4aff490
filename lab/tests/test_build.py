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


def test_packaged_kernels_have_releases_of_their_own():
    """`ptlab package`: both kernels install side by side"""
    assert build.package_release("patched") == "-ptlab"
    assert build.package_release("vanilla") == "-ptlab-vanilla"


def test_the_image_to_boot_is_taken_out_of_the_linux_image_package(tmp_path):
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: linux-image-6.12.117-ptlab\nVersion: 6.12.117-1\nArchitecture: amd64\n"
        "Maintainer: ptlab <ptlab@localhost>\nDescription: test\n")
    (root / "boot").mkdir()
    (root / "boot" / "vmlinuz-6.12.117-ptlab").write_bytes(b"image")
    deb = tmp_path / "linux-image-6.12.117-ptlab_6.12.117-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-b", "-Zgzip", str(root), str(deb)], check=True,
                   capture_output=True)
    headers = tmp_path / "linux-headers-6.12.117-ptlab_6.12.117-1_amd64.deb"
    headers.write_bytes(b"not read")
    image = build.package_image([headers, deb], tmp_path / "build")
    assert image.name == "vmlinuz-6.12.117-ptlab" and image.read_bytes() == b"image"
