"""hpctrain bench data: the loader grid, the decode limit, the model comparison, the advice.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_bench_data.py."""


from hpctrain.config import load_config
from hpctrain.bench.data_path import DataBench, Setting, advise, worker_grid


def bench(loader: float, model: float | None, dataset="imagefolder", ratio=0.9) -> DataBench:
    best = Setting(4, 2, loader)
    return DataBench("r", dataset, "image", 64, 224, 8, 1, "pil", 500.0, [best], best, best,
                     loader / ratio, ratio, model, None if model is None else
                     max(0.0, 1 - loader / model))


def test_the_advice_says_whether_and_by_how_much_the_model_starves():
    config = load_config("default", ["data.dataset=imagefolder", "data.path=/data/x"])
    starved = advise(bench(600, 1000), config)
    assert starved[0] == ("use data.num_workers=4 data.prefetch_factor=2 (the smallest "
                          "setting within 5% of the best)")
    assert "would starve the model: 600 img/s against 1,000" in starved[1]
    assert "wait 40% of the time" in starved[1]
    assert any(line.startswith("pack the images into shards (hpctrain pack /data/x") for
               line in starved)
    assert "little margin (1.10x" in advise(bench(1100, 1000), config)[1]
    fed = advise(bench(3000, 1000), config)
    assert fed[1] == "the loader keeps up: 3.0x the model's 1,000 img/s"
    assert not any("pack the images" in line for line in fed)
    assert any("reaches 20% of what its cores decode" in line
               for line in advise(bench(3000, None, ratio=0.2), config))


def test_worker_grid_and_bad_lists(run_cli):
    assert worker_grid(1) == [1] and worker_grid(6) == [1, 2, 4, 6]
    assert worker_grid(16) == [1, 2, 4, 8, 16]
    code, _, err = run_cli("bench", "data", "default", "--workers", "0,x")
    assert code == 2 and "--workers '0,x': use positive whole numbers" in err


def test_python_sampling_places_each_sample_in_a_stage_by_its_innermost_frame():
    from hpctrain.bench.python_profile import parse_py_spy, stage_of

    assert stage_of(["_work (batch_buffers.py:80)", "render_view (datasets.py:124)",
                     "interpolate (torch/nn/functional.py:5257)"]) == "augmentation"
    assert stage_of(["render_into (shard_dataset.py:150)", "decode_crop (shard_dataset.py:104)",
                     "decode_jpeg (shard_dataset.py:62)"]) == "decoding"
    assert stage_of(["_worker_loop (worker.py:300)", "default_collate (collate.py:200)"]) \
        == "transport"
    assert stage_of(["main (x.py:1)", "spin (x.py:9)"]) == "rest"
    worker_loop = "_bootstrap (multiprocessing/process.py:314);_work (hpctrain/batch_buffers.py:1)"
    raw = ('process 10:"python";decode_jpeg (shard_dataset.py:62) 3\n'
           'process 10:"python";process 12:"python -c import os\nspin()";spin (<string>:2) 1\n'
           f'process 10:"python";process 11:"python";{worker_loop};decode_jpeg (s.py:62) 6\n'
           f'process 10:"python";process 11:"python";{worker_loop};ShardReader.read (s.py:9) 2\n'
           'process 10:"python";_Workers.finished (b.py:5);Queue.get (queues.py:103) 1\n')
    training, worker, other = parse_py_spy(raw, root=10)
    # a child that never ran a loader's loop; its `python -c` script's line break is no stack
    assert (other.role, other.pid, other.hottest) == ("other process", 12,
                                                      [("spin (<string>:2)", 1.0)])
    torch_worker = "_worker_loop (torch/utils/data/_utils/worker.py:300);fetch (f.py:1) 1"
    assert [p.role for p in parse_py_spy(f'process 10:"p";process 13:"p";{torch_worker}\n',
                                         root=10)] == ["worker"]
    # there before the sampling began: another loader's worker, not the one measured
    assert [p.role for p in parse_py_spy(f'process 10:"p";process 13:"p";{torch_worker}\n',
                                         root=10, before=frozenset({13}))] == ["other process"]
    assert (training.role, training.pid, training.samples) == ("training process", 10, 4)
    assert training.stages["decoding"] == 0.75 and training.stages["transport"] == 0.25
    assert (worker.role, worker.pid, worker.samples) == ("worker", 11, 8)
    assert worker.stages["decoding"] == 0.75 and worker.stages["reading"] == 0.25
    assert worker.hottest == [("decode_jpeg (s.py:62)", 0.75), ("ShardReader.read (s.py:9)",
                                                                 0.25)]
