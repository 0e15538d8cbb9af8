"""pipeline.data.images: image files decoded in (spawned) DataLoader workers, bad files, resuming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import ToTensor

import pipeline.data.images as images_module
from pipeline.data.images import BadImage, ImageFiles, SkippedImage, iter_image_batches

H, W = 6, 8
TO_TENSOR = ToTensor()  # PIL uint8 -> float (3, H, W) in [0, 1]; a picklable class for spawned workers


def colour(i: int) -> tuple[int, int, int]:
    """The solid colour of good image i: (10 i, 20 + i, 255 - 5 i)."""
    return (10 * i, 20 + i, 255 - 5 * i)


def expected_pixels(i: int) -> torch.Tensor:
    """What ToTensor gives for the solid image i: each channel constant at value / 255."""
    return torch.tensor(colour(i), dtype=torch.float32).div(255).view(3, 1, 1).expand(3, H, W)


@pytest.fixture()
def folder(tmp_path: Path) -> tuple[list[Path], dict[int, str]]:
    """7 files: solid-colour PNGs, except row 2 (not an image), row 4 (truncated PNG) and row 6 (missing).

    Returns the paths and, for each bad row, the exception type the decoder reports.
    """
    paths = []
    for i in range(7):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.full((H, W, 3), colour(i), dtype=np.uint8)).save(path)
        paths.append(path)
    paths[2].write_bytes(b"this is not an image")
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(paths[4])  # large enough that its header survives the truncation
    whole = paths[4].read_bytes()
    paths[4].write_bytes(whole[: len(whole) // 2])
    paths[6].unlink()
    return paths, {2: "UnidentifiedImageError", 4: "OSError", 6: "FileNotFoundError"}


def test_image_files_decodes_exact_pixels_and_reports_bad_files(folder):
    paths, bad = folder
    dataset = ImageFiles(paths, TO_TENSOR)
    assert len(dataset) == 7
    item = dataset[3]
    assert (item.index, item.ok, item.reason) == (3, True, "")
    torch.testing.assert_close(item.pixels, expected_pixels(3), rtol=0, atol=0)
    for row, error in bad.items():
        item = dataset[row]
        assert item.index == row and not item.ok and item.pixels.numel() == 0
        assert item.reason.startswith(error), item.reason


def test_grey_and_rgba_images_become_rgb(tmp_path):
    grey, rgba = tmp_path / "grey.png", tmp_path / "rgba.png"
    Image.fromarray(np.full((H, W), 51, dtype=np.uint8), mode="L").save(grey)
    Image.fromarray(np.full((H, W, 4), (255, 0, 0, 128), dtype=np.uint8), mode="RGBA").save(rgba)
    dataset = ImageFiles([grey, rgba], TO_TENSOR)
    torch.testing.assert_close(dataset[0].pixels, torch.full((3, H, W), 0.2), rtol=0, atol=0)
    assert dataset[1].pixels.shape == (3, H, W) and dataset[1].pixels[0].min() == 1.0


def test_iter_batches_skip_keeps_rows_aligned(folder):
    paths, bad = folder
    batches = list(iter_image_batches(paths, TO_TENSOR, batch_size=3, num_workers=0))
    assert [b.rows for b in batches] == [range(0, 3), range(3, 6), range(6, 7)]
    assert [b.indices.tolist() for b in batches] == [[0, 1], [3, 5], []]
    assert [[x.index for x in b.bad] for b in batches] == [[2], [4], [6]]
    assert batches[0].bad[0].path == str(paths[2]) and batches[0].bad[0].reason.startswith("UnidentifiedImageError")
    torch.testing.assert_close(batches[1].pixels, torch.stack([expected_pixels(3), expected_pixels(5)]), rtol=0, atol=0)
    assert batches[0].indices.dtype == np.int64
    assert batches[2].pixels.numel() == 0  # a batch with only bad images still reports its rows


def test_iter_batches_fail_raises_at_the_first_bad_image(folder):
    paths, _ = folder
    batches = iter_image_batches(paths, TO_TENSOR, batch_size=2, num_workers=0, on_bad_image="fail")
    first = next(batches)
    assert first.indices.tolist() == [0, 1]
    with pytest.raises(BadImage, match=r"img2\.png: unreadable image \(UnidentifiedImageError.*; image 2 of the list"):
        next(batches)


def test_iter_batches_resumes_from_start(folder):
    paths, _ = folder
    good = [p for i, p in enumerate(paths) if i not in (2, 4, 6)]  # rows 0, 1, 3, 5 -> new rows 0..3
    batches = list(iter_image_batches(good, TO_TENSOR, batch_size=2, num_workers=0, start=1))
    assert [b.rows for b in batches] == [range(1, 3), range(3, 4)]
    assert [b.indices.tolist() for b in batches] == [[1, 2], [3]]
    torch.testing.assert_close(batches[1].pixels[0], expected_pixels(5), rtol=0, atol=0)
    assert list(iter_image_batches(good, TO_TENSOR, batch_size=2, num_workers=0, start=4)) == []


def test_spawned_workers_give_the_same_batches(folder, monkeypatch):
    paths, _ = folder
    contexts = []
    real_loader = images_module.DataLoader

    def recording_loader(*args, **kwargs):
        contexts.append(kwargs.get("multiprocessing_context"))
        return real_loader(*args, **kwargs)

    monkeypatch.setattr(images_module, "DataLoader", recording_loader)
    inline = list(iter_image_batches(paths, TO_TENSOR, batch_size=3, num_workers=0, start=1))
    spawned = list(iter_image_batches(paths, TO_TENSOR, batch_size=3, num_workers=1, start=1))
    assert contexts == [None, "spawn"]
    assert len(spawned) == len(inline) == 2
    for a, b in zip(inline, spawned):
        assert a.rows == b.rows and a.indices.tolist() == b.indices.tolist() and a.bad == b.bad
        torch.testing.assert_close(a.pixels, b.pixels, rtol=0, atol=0)
    assert spawned[0].bad == [SkippedImage(2, str(paths[2]), spawned[0].bad[0].reason)]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(num_workers=-1), ValueError, "num_workers"),
        (dict(start=8), ValueError, r"start: expected an integer row in \[0, 7\]"),
        (dict(on_bad_image="ignore"), ValueError, "on_bad_image"),
        (dict(prefetch_factor=0), ValueError, "prefetch_factor"),
    ],
)
def test_iter_batches_rejects_bad_arguments(folder, kwargs, error, message):
    paths, _ = folder
    arguments = dict(batch_size=2, num_workers=0) | kwargs
    with pytest.raises(error, match=message):
        iter_image_batches(paths, TO_TENSOR, **arguments)  # raised at the call, before any decoding


def test_iter_batches_rejects_an_empty_path_list():
    with pytest.raises(ValueError, match="paths: expected at least one image file"):
        iter_image_batches([], TO_TENSOR, batch_size=2, num_workers=0)


def test_image_files_rejects_a_single_path_and_a_non_callable(tmp_path):
    with pytest.raises(TypeError, match="paths"):
        ImageFiles(str(tmp_path / "a.png"), TO_TENSOR)
    with pytest.raises(TypeError, match="transform"):
        ImageFiles([tmp_path / "a.png"], "not callable")
