"""controller/folder.py on real folders: once a folder is open, links on its path or inside it
redirect nothing, names are single components, and nothing is replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.folder import Folder
from controller.volume import UnsafePath


def _open(path: Path) -> Folder:
    return Folder(os.open(path, os.O_RDONLY | os.O_DIRECTORY), path.name)


def test_an_open_folder_keeps_writing_where_it_is_when_its_path_becomes_a_link(tmp_path: Path) -> None:
    real, outside = tmp_path / "uploads", tmp_path / "outside"
    real.mkdir()
    outside.mkdir()
    with _open(real) as folder:
        real.rename(tmp_path / "moved")
        real.symlink_to(outside)
        with folder.sub("targets", create=True) as sub:
            os.close(sub.create("a.jpg"))
        assert folder.file_bytes() == 0
    assert list(outside.iterdir()) == []
    assert (tmp_path / "moved" / "targets" / "a.jpg").is_file()


def test_links_inside_are_never_followed_nor_replaced(tmp_path: Path) -> None:
    top, outside = tmp_path / "top", tmp_path / "outside"
    top.mkdir()
    outside.mkdir()
    (top / "dir").symlink_to(outside)
    (top / "file").symlink_to(outside / "x")
    with _open(top) as folder:
        with pytest.raises(OSError):
            folder.sub("dir", create=True)
        with pytest.raises(FileExistsError):
            folder.create("file")
        with pytest.raises(UnsafePath):
            folder.open_file("file")
        os.close(folder.create("new"))
        with pytest.raises(FileExistsError):
            folder.move("new", folder, "file")  # never replaced
        for bad in ("", ".", "..", "a/b"):
            with pytest.raises(UnsafePath):
                folder.create(bad)
        folder.clear()
    assert list(top.iterdir()) == [] and list(outside.iterdir()) == []
