"""Containment under the data root: `..`, absolute paths and symlinks never lead out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.job.paths import Resolver, check_relative, relative_to_root, resolve_inside, safe_glob, to_container


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "crowd" / "sub").mkdir(parents=True)
    for name in ("crowd/b.jpg", "crowd/a.jpg", "crowd/sub/c.jpg", "top.jpg", "crowd/.a.jpg.tmp"):
        (r / name).write_bytes(b"x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.jpg").write_bytes(b"s")
    return r


# --- check_relative ----------------------------------------------------------------------------


def test_check_relative_normalises() -> None:
    assert check_relative("a/./b/../c.jpg", what="source") == "a/c.jpg"


@pytest.mark.parametrize(
    ("rel", "message"),
    [
        ("/etc/passwd", "absolute paths are not allowed: '/etc/passwd'"),
        ("../x", "'../x' leads out of the data root"),
        ("a/../../x", "'a/../../x' leads out of the data root"),
        ("..", "'..' leads out of the data root"),
        ("", "source is empty"),
        ("  ", "source is empty"),
        ("a\0b", "source contains a NUL character"),
    ],
)
def test_check_relative_refuses(rel: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        check_relative(rel, what="source")
    assert message in str(e.value)


# --- resolve_inside ----------------------------------------------------------------------------


def test_resolve_inside_plain(root: Path) -> None:
    assert resolve_inside(root, "crowd/a.jpg", what="source") == (root / "crowd" / "a.jpg").resolve()


def test_resolve_inside_allows_dotdot_that_stays_inside(root: Path) -> None:
    assert resolve_inside(root, "crowd/sub/../a.jpg", what="source") == (root / "crowd" / "a.jpg").resolve()


def test_resolve_inside_allows_missing_paths(root: Path) -> None:
    assert resolve_inside(root, "out/new/x.jpg", what="output") == root.resolve() / "out" / "new" / "x.jpg"


def test_resolve_inside_refuses_dotdot_escape(root: Path) -> None:
    with pytest.raises(ValueError) as e:
        resolve_inside(root, "../x", what="source")
    assert str(e.value) == f"'../x' escapes the data root {root}"


def test_resolve_inside_refuses_deep_dotdot_escape(root: Path) -> None:
    with pytest.raises(ValueError, match="escapes the data root"):
        resolve_inside(root, "crowd/../../outside/secret.jpg", what="source")


def test_resolve_inside_refuses_absolute(root: Path) -> None:
    with pytest.raises(ValueError) as e:
        resolve_inside(root, "/etc/passwd", what="source")
    assert str(e.value) == "absolute paths are not allowed: '/etc/passwd'"


def test_resolve_inside_refuses_absolute_even_inside_root(root: Path) -> None:
    with pytest.raises(ValueError, match="absolute paths are not allowed"):
        resolve_inside(root, str(root / "top.jpg"), what="source")


def test_resolve_inside_refuses_symlinked_folder_leading_out(root: Path) -> None:
    os.symlink(root.parent / "outside", root / "link")
    with pytest.raises(ValueError) as e:
        resolve_inside(root, "link/secret.jpg", what="source")
    assert str(e.value) == "'link/secret.jpg' resolves outside the data root through a symlink"


def test_resolve_inside_refuses_symlinked_file_leading_out(root: Path) -> None:
    os.symlink(root.parent / "outside" / "secret.jpg", root / "crowd" / "evil.jpg")
    with pytest.raises(ValueError, match="through a symlink"):
        resolve_inside(root, "crowd/evil.jpg", what="source")


def test_resolve_inside_refuses_dotdot_after_a_symlink(root: Path) -> None:
    """`link/..` is the link target's parent, not the root: realpath semantics, not string ones."""
    (root.parent / "outside" / "deep").mkdir()
    os.symlink(root.parent / "outside" / "deep", root / "link")
    with pytest.raises(ValueError, match="through a symlink"):
        resolve_inside(root, "link/../secret.jpg", what="source")


def test_a_folder_swapped_for_a_link_below_the_root_is_seen_by_the_next_resolver(root: Path) -> None:
    """A folder two levels down that becomes a link leading out after one check is refused by the next
    check: each resolver looks at the disk anew (none keeps a folder's real path between jobs)."""
    assert Resolver(root).inside_str("crowd/sub/c.jpg", what="source") == str(root.resolve() / "crowd/sub/c.jpg")
    (root / "crowd" / "sub" / "c.jpg").unlink()
    (root / "crowd" / "sub").rmdir()
    os.symlink(root.parent / "outside", root / "crowd" / "sub")
    for listed in (True, False):
        with pytest.raises(ValueError, match="through a symlink"):
            Resolver(root, listings=True).inside_str("crowd/sub/secret.jpg", what="source", listed=listed)


def test_missing_folders_resolve_as_written(root: Path) -> None:
    assert Resolver(root).inside_str("out/job-1/a.jpg", what="output") == str(root.resolve() / "out/job-1/a.jpg")


def test_resolve_inside_follows_symlinks_that_stay_inside(root: Path) -> None:
    os.symlink(root / "crowd", root / "alias")
    assert resolve_inside(root, "alias/a.jpg", what="source") == (root / "crowd" / "a.jpg").resolve()


def test_resolve_inside_works_when_the_root_is_a_symlink(root: Path, tmp_path: Path) -> None:
    os.symlink(root, tmp_path / "mnt")
    assert resolve_inside(tmp_path / "mnt", "crowd/a.jpg", what="source") == (root / "crowd" / "a.jpg").resolve()


# --- to_container / relative_to_root -----------------------------------------------------------


def test_to_container(root: Path) -> None:
    assert to_container(root, root / "crowd" / "a.jpg") == "/data/crowd/a.jpg"
    assert to_container(root, root / "crowd" / "." / "sub" / ".." / "a.jpg") == "/data/crowd/a.jpg"
    assert to_container(root, root) == "/data"


def test_to_container_accepts_resolved_paths_under_a_symlinked_root(root: Path, tmp_path: Path) -> None:
    os.symlink(root, tmp_path / "mnt")
    mnt = tmp_path / "mnt"
    assert to_container(mnt, resolve_inside(mnt, "crowd/a.jpg", what="x")) == "/data/crowd/a.jpg"
    assert to_container(mnt, mnt / "crowd" / "a.jpg") == "/data/crowd/a.jpg"


def test_to_container_refuses_paths_outside(root: Path) -> None:
    with pytest.raises(ValueError, match="is not under the data root"):
        to_container(root, root.parent / "outside" / "secret.jpg")
    with pytest.raises(ValueError, match="is not under the data root"):
        to_container(root, root.parent / "rootless")  # a sibling sharing the prefix "root"


def test_relative_to_root(root: Path) -> None:
    assert relative_to_root(root, root / "crowd" / "a.jpg") == "crowd/a.jpg"
    assert relative_to_root(root, root) == "."


# --- safe_glob ---------------------------------------------------------------------------------


def test_safe_glob_sorted_files_only(root: Path) -> None:
    assert safe_glob(root, "crowd/*") == [(root / "crowd" / n).resolve() for n in ("a.jpg", "b.jpg")]


def test_safe_glob_recursive(root: Path) -> None:
    found = [p.relative_to(root.resolve()).as_posix() for p in safe_glob(root, "**/*.jpg")]
    assert found == ["crowd/a.jpg", "crowd/b.jpg", "crowd/sub/c.jpg", "top.jpg"]


def test_safe_glob_excludes_hidden_files(root: Path) -> None:
    assert safe_glob(root, "crowd/.*") == []


def test_safe_glob_no_match(root: Path) -> None:
    assert safe_glob(root, "clips/*.mp4") == []


def test_safe_glob_refuses_symlink_leading_out(root: Path) -> None:
    os.symlink(root.parent / "outside" / "secret.jpg", root / "crowd" / "evil.jpg")
    with pytest.raises(ValueError) as e:
        safe_glob(root, "crowd/*.jpg")
    assert "'crowd/evil.jpg' resolves outside the data root through a symlink" in str(e.value)


def test_safe_glob_refuses_symlinked_folder_leading_out_under_doublestar(root: Path) -> None:
    os.symlink(root.parent / "outside", root / "link")
    with pytest.raises(ValueError) as e:
        safe_glob(root, "**/*.jpg")
    assert str(e.value) == (
        "'**/*.jpg' reaches the symlinked folder 'link': wildcards do not follow symlinked folders "
        "(name the folder it points to, or remove the link)"
    )


def test_safe_glob_link_loops_are_refused_not_walked(root: Path) -> None:
    """Three `l -> .` links made Python's glob walk 77,000 paths and climbing (issue #15)."""
    for name in ("l1", "l2", "l3"):
        os.symlink(".", root / "crowd" / name)
    with pytest.raises(ValueError, match="reaches the symlinked folder 'crowd/l1'"):
        safe_glob(root, "crowd/**/*.jpg")
    with pytest.raises(ValueError, match="reaches the symlinked folder 'crowd/l1'"):
        safe_glob(root, "crowd/*/*.jpg")
    assert [p.name for p in safe_glob(root, "crowd/*.jpg")] == ["a.jpg", "b.jpg"]  # no folder walked


def test_safe_glob_follows_a_symlinked_folder_named_literally(root: Path) -> None:
    os.symlink(root / "crowd", root / "alias")
    assert safe_glob(root, "alias/*.jpg") == [(root / "crowd" / n).resolve() for n in ("a.jpg", "b.jpg")]


def test_safe_glob_walk_is_bounded(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import controller.job.paths as paths

    monkeypatch.setattr(paths, "GLOB_WALK_LIMIT", 3)
    with pytest.raises(ValueError) as e:
        safe_glob(root, "**/*.jpg")
    assert str(e.value) == (
        "'**/*.jpg' looks at more than 3 files and folders (the limit for one pattern); name a narrower folder"
    )


@pytest.mark.parametrize("pattern", ["/etc/*", "../*", "crowd/../../outside/*"])
def test_safe_glob_refuses_patterns_leading_out(root: Path, pattern: str) -> None:
    with pytest.raises(ValueError):
        safe_glob(root, pattern)


def test_broad_glob_skips_run_folders_and_model_packs(tmp_path: Path) -> None:
    for rel in ("a/x.jpg", "runs/j/out.jpg", "models/default/x.jpg", "b/runs/y.jpg"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    found = [p.relative_to(tmp_path.resolve()).as_posix() for p in safe_glob(tmp_path, "**/*.jpg")]
    assert found == ["a/x.jpg", "b/runs/y.jpg"]
    assert [p.name for p in safe_glob(tmp_path, "runs/j/*.jpg")] == ["out.jpg"]  # asked for explicitly


# --- Resolver with folder listings (planning 100,000 targets) ----------------------------------


def _answers(resolver: Resolver, rel: str) -> tuple[str, bool, bool] | str:
    try:
        real = resolver.inside_str(rel, what="output")
    except ValueError as e:
        return str(e)
    return real, resolver.isfile(real), resolver.isdir(real)


def test_listings_answer_as_the_disk_does(root: Path, tmp_path: Path) -> None:
    """The listing-based look-ups refuse, resolve and classify every kind of entry exactly as the
    per-path system calls do: links in and out, to files and folders, dangling, a fifo, absent."""
    os.symlink(root / "crowd" / "a.jpg", root / "crowd" / "in.jpg")
    os.symlink(tmp_path / "outside" / "secret.jpg", root / "crowd" / "out.jpg")
    os.symlink(root / "crowd" / "sub", root / "crowd" / "subdir-link")
    os.symlink(tmp_path / "outside", root / "away")
    os.symlink(root / "nowhere.jpg", root / "crowd" / "dangling.jpg")
    os.mkfifo(root / "crowd" / "pipe.jpg")
    rels = [
        "crowd/a.jpg",
        "crowd/in.jpg",
        "crowd/out.jpg",
        "crowd/subdir-link",
        "crowd/subdir-link/c.jpg",
        "away/secret.jpg",
        "away/new.jpg",
        "crowd/dangling.jpg",
        "crowd/pipe.jpg",
        "crowd/sub",
        "crowd/none.jpg",
        "new/folder/x.jpg",
        "top.jpg",
        "crowd/../top.jpg",
        "crowd/..",
        "crowd/",
        "./crowd//a.jpg",
        "../x.jpg",
        "a/../../x.jpg",
        ".",
    ]
    listed, plain = Resolver(root, listings=True), Resolver(root)
    for rel in rels * 2:  # the second pass answers from the caches
        assert _answers(listed, rel) == _answers(plain, rel), rel
    assert _answers(listed, "crowd/in.jpg") == (str((root / "crowd" / "a.jpg").resolve()), True, False)
    assert _answers(listed, "crowd/out.jpg") == "'crowd/out.jpg' resolves outside the data root through a symlink"
    assert _answers(listed, "crowd/subdir-link")[1:] == (False, True)
    assert _answers(listed, "crowd/pipe.jpg")[1:] == (False, False)
    assert _answers(listed, "a/../../x.jpg") == f"'a/../../x.jpg' escapes the data root {root}"
