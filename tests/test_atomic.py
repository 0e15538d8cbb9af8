"""pipeline.atomic: an output is either the previous complete one or the new complete one, never half of either."""

from __future__ import annotations

import pytest

from pipeline.atomic import atomic_dir, atomic_file, replace_dir, temporary_sibling, write_text_atomic


def test_atomic_dir_replaces_the_target_only_when_the_block_ends(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        assert tmp == tmp_path / "out.tmp" and tmp.is_dir() and list(tmp.iterdir()) == []
        (tmp / "new.txt").write_text("new")
        assert (target / "old.txt").read_text() == "old", "the target is untouched while the block runs"
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert not temporary_sibling(target).exists() and not (tmp_path / "out.old").exists()


def test_a_failed_block_leaves_the_previous_output_whole(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_dir(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("killed")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]


def test_a_leftover_sibling_is_removed_or_resumed(tmp_path):
    target = tmp_path / "out"
    left = temporary_sibling(target)
    left.mkdir()
    (left / "chunk-0").write_text("done")
    with atomic_dir(target, resume=True) as tmp:
        assert (tmp / "chunk-0").read_text() == "done", "a resumable writer continues from what a killed run left"
    assert (target / "chunk-0").exists()
    left.mkdir()
    (left / "stale").write_text("x")
    with atomic_dir(target) as tmp:
        assert list(tmp.iterdir()) == [], "any other writer starts afresh"
    assert list(target.iterdir()) == []


def test_atomic_file_writes_through_a_sibling_and_cleans_up_on_failure(tmp_path):
    target = tmp_path / "sub" / "record.json"
    write_text_atomic(target, "{}")
    assert target.read_text() == "{}"
    with pytest.raises(ValueError):
        with atomic_file(target) as tmp:
            tmp.write_text("{half")
            raise ValueError("stop")
    assert target.read_text() == "{}" and not temporary_sibling(target).exists()


def test_replace_dir_over_a_missing_target(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a")
    replace_dir(src, tmp_path / "dst")
    assert (tmp_path / "dst" / "a").read_text() == "a" and not src.exists()
