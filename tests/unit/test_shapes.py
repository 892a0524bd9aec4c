"""The built-in shapes dataset: deterministic, complete, generated once."""

import numpy as np

from hpctrain.data.images.shapes import CLASSES, ensure_shapes, render


def test_rendering_is_a_pure_function_of_seed_split_and_index():
    a, label_a = render(0, "train", 7, 24)
    b, label_b = render(0, "train", 7, 24)
    assert label_a == label_b == 7 % len(CLASSES)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    other, _ = render(1, "train", 7, 24)
    val, _ = render(0, "val", 7, 24)
    assert not np.array_equal(np.asarray(a), np.asarray(other))
    assert not np.array_equal(np.asarray(a), np.asarray(val))
    assert a.size == (24, 24) and a.mode == "RGB"


def test_at_least_ten_classes_with_varied_images():
    assert len(CLASSES) >= 10
    images = [np.asarray(render(0, "train", i, 32)[0], dtype=np.float32) for i in range(0, 40, 10)]
    # same class (index % 10 == 0), yet different colours, positions and backgrounds
    assert all(np.abs(images[0] - other).mean() > 10 for other in images[1:])


def test_generated_once_in_imagefolder_layout(tmp_path):
    folder = ensure_shapes(tmp_path, seed=3, num_train=30, num_val=20, size=16)
    train = sorted(folder.glob("train/*/*.jpg"))
    val = sorted(folder.glob("val/*/*.jpg"))
    assert len(train) == 30 and len(val) == 20
    assert {p.parent.name for p in train} == set(CLASSES)
    stamp = train[0].stat().st_mtime_ns
    assert ensure_shapes(tmp_path, seed=3, num_train=30, num_val=20, size=16) == folder
    assert train[0].stat().st_mtime_ns == stamp  # reused, not regenerated
    assert not list(tmp_path.glob("*.tmp*"))


def test_an_interrupted_generation_is_redone(tmp_path):
    folder = ensure_shapes(tmp_path, seed=0, num_train=10, num_val=10, size=16)
    (folder / "complete.json").unlink()  # as if the process died before the marker
    (folder / "train" / CLASSES[0] / "000000.jpg").unlink()
    ensure_shapes(tmp_path, seed=0, num_train=10, num_val=10, size=16)
    assert (folder / "train" / CLASSES[0] / "000000.jpg").exists()


def test_generation_in_a_log_prints_its_progress(tmp_path, capsys, monkeypatch):
    """Where stdout is no terminal (a job's log), the two minutes of the default recipe's
    generation were silent (issue 53): a line every LOG_EVERY seconds says how far it is."""
    from hpctrain import progress_bar

    monkeypatch.setattr(progress_bar, "LOG_EVERY", 0.0)
    ensure_shapes(tmp_path, seed=0, num_train=1000, num_val=100, size=16)
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("hpctrain: generating the shapes dataset: ")
                         for line in lines)
    assert lines[-1].startswith("hpctrain: generating the shapes dataset: 1,100 of 1,100 "
                                "(100%), about 0 s left")
    monkeypatch.setattr(progress_bar, "LOG_EVERY", 60.0)  # done within the first interval
    ensure_shapes(tmp_path, seed=1, num_train=30, num_val=20, size=16)
    assert capsys.readouterr().out == ""
