"""Where a run keeps what torch compiled (train/compilation.py): its folder chosen, keyed,
given back when the run ends, and refused where torch could not lock it."""

import dataclasses
import errno
import fcntl
import os
from contextlib import ExitStack
from pathlib import Path

import torch

from hpctrain.config.loading import load_config
from hpctrain.train import compilation
from hpctrain.train.hardware.system import SystemPlan


def test_the_run_s_folder_is_torch_s_until_the_run_ends(tmp_path, monkeypatch):
    monkeypatch.delenv(compilation.CACHE_VARIABLE, raising=False)
    monkeypatch.setattr(compilation, "YOURS", None)
    with ExitStack() as held:
        said = compilation.keep_cache("run", tmp_path, torch.device("cpu"), held)
        folder = tmp_path / "compile-cache" / compilation.cache_key(torch.device("cpu"))
        assert os.environ[compilation.CACHE_VARIABLE] == str(folder) and folder.is_dir()
        assert said == f"kept in {folder} (empty: compiled in this job, loaded by the next)"
        (folder / "kernel.so").write_bytes(b"")
        assert "1 files from earlier jobs" in compilation.keep_cache(
            "run", tmp_path, torch.device("cpu"), ExitStack())
    assert compilation.CACHE_VARIABLE not in os.environ  # as it was before the run


def test_a_shared_folder_holds_one_subfolder_per_machine_and_version(tmp_path, monkeypatch):
    monkeypatch.setattr(compilation, "YOURS", None)
    with ExitStack() as held:
        compilation.keep_cache(str(tmp_path / "shared"), tmp_path / "run", torch.device("cpu"),
                               held)
    key = compilation.cache_key(torch.device("cpu"))
    assert [p.name for p in (tmp_path / "shared").iterdir()] == [key]
    assert key.startswith(f"torch{torch.__version__.split('+')[0]}") and "/" not in key
    # shared, the default: the output folder's, beside the runs, for every run of it
    with ExitStack() as held:
        said = compilation.keep_cache("shared", tmp_path / "runs" / "a", torch.device("cpu"),
                                      held)
    assert said.startswith(f"kept in {tmp_path / 'runs' / '.compile-cache' / key} (empty")
    (tmp_path / "runs" / ".compile-cache" / key / "kernels").mkdir()
    for number in range(compilation.FILES_COUNTED + 5):  # counted up to a bound
        (tmp_path / "runs" / ".compile-cache" / key / "kernels" / str(number)).touch()
    with ExitStack() as held:
        said = compilation.keep_cache("shared", tmp_path / "runs" / "b", torch.device("cpu"),
                                      held)
    assert f"({compilation.FILES_COUNTED}+ files from earlier jobs" in said
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / ".compile-cache").symlink_to(elsewhere)
    said = compilation.keep_cache("shared", tmp_path / "linked" / "a", torch.device("cpu"),
                                  ExitStack())
    assert "is a link, which hpctrain does not follow" in said and not any(elsewhere.iterdir())
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert compilation.cache_key(torch.device("cpu")) != key


def test_your_own_variable_and_none_are_left_to_torch(tmp_path, monkeypatch):
    """Your TORCHINDUCTOR_CACHE_DIR is kept, torch's default left set by a process that
    compiled before this one started it is not yours; `none` leaves torch's."""
    monkeypatch.setattr(compilation, "YOURS", "/scratch/mine")
    assert compilation.keep_cache("run", tmp_path, torch.device("cpu"), ExitStack()) == \
        "kept in /scratch/mine (your TORCHINDUCTOR_CACHE_DIR, which compile_cache=run leaves be)"
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(compilation, "YOURS", default_cache_dir())  # a compiling parent's
    with ExitStack() as held:
        assert compilation.keep_cache("run", tmp_path, torch.device("cpu"), held).startswith(
            f"kept in {tmp_path / 'compile-cache'}")
    monkeypatch.setattr(compilation, "YOURS", None)
    assert "a job on another node compiles again" in compilation.keep_cache(
        "none", tmp_path / "elsewhere", torch.device("cpu"), ExitStack())
    assert not (tmp_path / "elsewhere" / "compile-cache").exists()


def test_a_folder_that_takes_no_lock_is_said_and_left(tmp_path, monkeypatch):
    """Lustre mounted without flock answers ENOSYS: torch's compiler would fail at its first
    lock, so the run leaves the cache where torch keeps it (flock itself is stood in for:
    no such file system here)."""
    monkeypatch.setattr(compilation, "YOURS", None)
    monkeypatch.delenv(compilation.CACHE_VARIABLE, raising=False)

    def no_locks(handle, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    said = compilation.keep_cache("run", tmp_path, torch.device("cpu"), ExitStack())
    assert said.startswith("kept where torch keeps them: ") and \
        "cannot hold them (Function not implemented)" in said
    assert compilation.CACHE_VARIABLE not in os.environ


def test_nothing_is_counted_before_torch_s_compiler_is_loaded(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "torch._dynamo.utils", raising=False)
    assert compilation.tally() == dict.fromkeys(compilation.TALLIED, 0.0)


def _plan(device: str = "cuda:0", compile_on: bool = True) -> SystemPlan:
    return SystemPlan(device, "NVIDIA H100 80GB HBM3", "bf16", True, compile_on, True, False)


def test_auto_captures_cuda_graphs_for_a_small_model_on_one_gpu_and_says_what_it_assumed():
    config = load_config("default", [])
    plan = compilation.with_mode(_plan(), config, processes=1, parameters=120_000)
    assert plan.compile_mode == "reduce-overhead"
    assert "0.12 M-parameter model's step is assumed launch-bound (under 10 M)" in \
        plan.compile_note
    # where the step is not launch-bound, or not whole on one GPU: torch's default mode
    for processes, parameters, why in ((1, 25_600_000, "25.6 M parameters keep the GPU busy"),
                                       (8, 120_000, "8 processes train it")):
        plan = compilation.with_mode(_plan(), config, processes, parameters)
        assert plan.compile_mode == "default"
        assert plan.compile_note == f"compile_mode default (auto; no CUDA graphs: {why})"
    # on a CPU, auto is torch's default and nothing is said
    plan = compilation.with_mode(_plan("cpu"), config, 1, 120_000)
    assert (plan.compile_mode, plan.compile_note) == ("default", "")
    # compile off: no mode
    assert compilation.with_mode(_plan(compile_on=False), config, 1, 120_000).compile_mode == ""


def test_auto_leaves_cuda_graphs_out_where_the_batches_shapes_vary():
    from hpctrain.data.kind import SHAPES

    documents = load_config("tiny-lm", ["data.tokens.batching=documents"])
    assert documents.data.kind_spec.shapes(documents.data) == "varied" and "varied" in SHAPES
    plan = compilation.with_mode(_plan(), documents, 1, 120_000)
    assert plan.compile_mode == "default" and "its batches' shapes are varied" in \
        plan.compile_note
    bucketed = load_config("tiny-lm", ["data.tokens.batching=documents",
                                       "data.tokens.width_buckets=4"])
    assert compilation.with_mode(_plan(), bucketed, 1, 120_000).compile_mode == \
        "reduce-overhead"


def test_cuda_graphs_asked_for_on_a_cpu_run_without_them_and_say_so():
    for asked, runs in (("reduce-overhead", "default"),
                        ("max-autotune", "max-autotune-no-cudagraphs")):
        plan = compilation.with_mode(_plan("cpu"), load_config("default", [
            f"compile_mode={asked}"]), 1, 120_000)
        assert plan.compile_mode == runs
        assert plan.compile_note == f"compile_mode {runs}: CUDA graphs ({asked}) need a GPU"
    plan = compilation.with_mode(_plan(), load_config("default", ["compile_mode=max-autotune"]),
                                 8, 10**9)
    assert (plan.compile_mode, plan.compile_note) == ("max-autotune", "")  # as asked


def test_cuda_graphs_on_batches_of_ever_new_widths_are_refused_in_one_line(run_cli):
    code, _, err = run_cli("run", "tiny-lm", "data.tokens.batching=documents",
                           "compile_mode=reduce-overhead")
    assert code == 2
    assert "compile_mode=reduce-overhead captures CUDA graphs, one per batch shape" in err
    assert "use data.tokens.width_buckets=8" in err and "Traceback" not in err


def test_each_call_of_a_graphed_module_begins_a_replay_and_torch_s_skips_are_gathered(
        monkeypatch):
    """Under CUDA graphs, a forward's outputs stay the caller's until its next call (an
    evaluation batch, the next micro-batch); why torch ran a graph without them is kept as
    its logger says it (torch's own function, as a GPU run calls it)."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    begun = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: begun.append(1))
    plain = compilation.replayed(torch.nn.Linear(2, 2), "default")
    plain(torch.ones(1, 2))
    assert begun == []
    graphed = compilation.replayed(torch.nn.Linear(2, 2), "reduce-overhead")
    graphed(torch.ones(1, 2))
    graphed(torch.ones(1, 2))
    assert len(begun) == 2
    before = compilation.tally()["cuda_graph_skips"]
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (1 "
                                        "instances)")
    assert compilation.tally()["cuda_graph_skips"] == before + 1
    assert compilation.graph_skip_reasons()[-1] == \
        "skipping cudagraphs due to mutated inputs (1 instances)"
    told = compilation.graphs_skipped(1, compilation.graph_skip_reasons())
    assert "without CUDA graphs (skipping cudagraphs due to mutated inputs" in told


def test_cudnn_attention_is_left_to_batches_of_a_few_shapes(tiny_config):
    """cuDNN builds an attention plan for each sequence length: a GPU run of ever new widths
    (or your collate's, unknown) runs flash or memory-efficient attention instead."""
    from hpctrain.train.hardware.system import apply_global_switches, cudnn_attention

    assert cudnn_attention(load_config("default", []))
    assert not cudnn_attention(load_config("tiny-lm", ["data.tokens.batching=documents"]))
    assert cudnn_attention(load_config("tiny-lm", ["data.tokens.batching=documents",
                                                   "data.tokens.width_buckets=4"]))
    assert cudnn_attention(load_config("tiny-lm", ["data.tokens.batching=documents",
                                                   "cudnn_attention=true"]))
    fixture = Path(__file__).parent.parent / "fixtures" / "tensor_data.py"
    yours = load_config("default", [f"data.dataset={fixture}:waves",
                                    f"model.name={fixture}:SignalNet"])
    assert not cudnn_attention(yours)
    # the switch reaches torch on a GPU run (a plan made for one: the flag is the process's)
    apply_global_switches(dataclasses.replace(_plan(), cudnn_attention=False), seed=0)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    apply_global_switches(dataclasses.replace(_plan(), cudnn_attention=True), seed=0)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    from hpctrain.train.hardware.system import plan_system

    assert not plan_system(tiny_config()).cudnn_attention  # a CPU has none
