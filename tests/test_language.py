"""Language modelling: token packs (round trip, resume, damage), the two batchings, answer
grading, and training runs (loss falls, bitwise resume, 2 processes equal 1)."""

from __future__ import annotations

import hashlib
import json
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader

from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.tokens import token_packing
from hpctrain.data.tokens.arithmetic import problems
from hpctrain.data.tokens.token_pack import TokenBlocks, TokenDocuments, TokenPack, pad_documents
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens
from hpctrain.data.tokens.tokenizer import BYTE_EOS, byte_tokenizer, huggingface_tokenizer
from hpctrain.errors import DataError
from hpctrain.models.gpt import gpt
from hpctrain.tasks.language_modeling import IGNORE, answer_sums, language_modeling

TEXTS = ["Grüße aus Göttingen.", "a\nb\nc", "x" * 300, "The end — fin."]


def write_corpus(root: Path, texts=TEXTS, split_folders: bool = False) -> Path:
    """.txt files (one document each) and a .jsonl file (one per line)."""
    folders = {"train": root / "train", "val": root / "val"} if split_folders else \
        {"train": root, "val": root}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    (folders["train"] / "a.txt").write_text(texts[0], encoding="utf-8")
    (folders["train"] / "b.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[1:3]) + "\n", encoding="utf-8")
    (folders["val"] / "c.txt").write_text(texts[3], encoding="utf-8")
    return root


def read_documents(pack: TokenPack, split: str) -> list[list[int]]:
    part = pack.split(split)
    return [part.shard(int(s))[int(a):int(a) + int(n)].tolist() for s, a, n in part.documents]


def test_a_token_pack_gives_back_every_token(tmp_path):
    src = write_corpus(tmp_path / "src", split_folders=True)
    manifest = pack_tokens(src, tmp_path / "pack", TokenPackOptions(), workers=1,
                           log=lambda _: None)
    pack = TokenPack(tmp_path / "pack")
    assert (pack.vocab_size, pack.eos_id, pack.dtype) == (257, BYTE_EOS, np.dtype("<u2"))
    encode = byte_tokenizer().encode
    assert read_documents(pack, "train") == [encode(t) for t in TEXTS[:3]]
    assert read_documents(pack, "val") == [encode(TEXTS[3])]
    assert manifest["splits"]["train"]["tokens"] == sum(len(encode(t)) + 1 for t in TEXTS[:3])
    # every document is followed by the end-of-text id in the shard
    train = pack.split("train")
    assert all(train.shard(int(s))[int(a) + int(n)] == BYTE_EOS for s, a, n in train.documents)


def test_a_hugging_face_tokenizer_packs_and_travels_with_the_pack(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"]))
    backend.save(str(tmp_path / "tokenizer.json"))
    src = write_corpus(tmp_path / "src", split_folders=True)
    pack_tokens(src, tmp_path / "pack", TokenPackOptions(tokenizer=str(tmp_path)), workers=1,
                log=lambda _: None)
    pack = TokenPack(tmp_path / "pack")
    tokenizer = huggingface_tokenizer(tmp_path / "pack")  # the copy kept in the pack
    assert pack.eos_id == tokenizer.eos_id == backend.token_to_id("<|endoftext|>")
    assert read_documents(pack, "train") == [tokenizer.encode(t) for t in TEXTS[:3]]
    assert [tokenizer.decode(ids) for ids in read_documents(pack, "val")] == [TEXTS[3]]


def test_an_interrupted_token_pack_resumes_with_the_jobs_it_finished(tmp_path):
    src = write_corpus(tmp_path / "src", split_folders=True)
    options = TokenPackOptions(shard_bytes=1)  # one job per file
    done = []
    original = token_packing.write_job

    def fail_on_the_third(job):
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(job.number)
        return original(job)

    token_packing.write_job = fail_on_the_third
    try:
        with pytest.raises(KeyboardInterrupt):
            pack_tokens(src, tmp_path / "pack", options, workers=1, log=lambda _: None)
    finally:
        token_packing.write_job = original
    assert not (tmp_path / "pack" / "pack.json").exists()
    said = []
    pack_tokens(src, tmp_path / "pack", options, workers=1, log=said.append)
    assert said == [f"pack: resuming {tmp_path / 'pack'}: 2 of 3 jobs already written"]
    pack = TokenPack(tmp_path / "pack")
    assert [len(s.shards) for s in pack.splits.values()] == [2, 1]
    assert read_documents(pack, "train") == [byte_tokenizer().encode(t) for t in TEXTS[:3]]


def test_hashed_validation_split_takes_about_its_share(tmp_path):
    texts = [f"document {i}" for i in range(400)]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "all.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                        for t in texts))
    manifest = pack_tokens(tmp_path / "src", tmp_path / "pack",
                           TokenPackOptions(val_fraction=0.25), workers=1, log=lambda _: None)
    val = manifest["splits"]["val"]["documents"]
    assert 60 < val < 140 and manifest["splits"]["train"]["documents"] + val == 400
    moved = shutil.move(tmp_path / "src", tmp_path / "elsewhere")  # the draw is the corpus's
    again = pack_tokens(moved, tmp_path / "again", TokenPackOptions(val_fraction=0.25),
                        workers=1, log=lambda _: None)
    assert again["splits"]["val"]["shards"] == manifest["splits"]["val"]["shards"]


def test_a_corpus_drawn_whole_for_validation_says_so(tmp_path, run_cli):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "one.txt").write_text("a single document")
    code, _, err = run_cli("pack", "--tokens", "--val-fraction", "0.999", str(tmp_path / "src"),
                           str(tmp_path / "pack"))
    assert code == 2 and "its 1 document(s) all went to val (val_fraction 0.999)" in err


@pytest.fixture
def stream_pack(tmp_path) -> TokenPack:
    """Documents of known ids: document d holds d+1 copies of id d."""
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "val").mkdir()
    docs = [chr(ord("a") + d) * (d + 1) for d in range(12)]
    (src / "train" / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                   for t in docs))
    (src / "val" / "d.jsonl").write_text(json.dumps({"text": "zz"}) + "\n")
    pack_tokens(src, tmp_path / "pack", TokenPackOptions(), workers=1, log=lambda _: None)
    return TokenPack(tmp_path / "pack")


def test_blocks_tile_the_stream_with_one_token_of_overlap(stream_pack):
    split = stream_pack.split("train")
    stream = split.shard(0).tolist()
    blocks = TokenBlocks(split, seq_len=8)
    assert len(blocks) == (len(stream) - 1) // 8
    for i in range(len(blocks)):
        assert blocks[i].tolist() == stream[i * 8:i * 8 + 9]


@pytest.mark.parametrize("workers", [0, 2])
def test_blocks_through_batch_buffers_are_torch_dataloaders_to_the_bit(stream_pack, workers):
    """data.loader=auto reads token blocks into shared batch buffers (batch_buffers.py): the
    same batches as torch's DataLoader, training (shuffled, two epochs) and validation (padded
    to the ranks, its last batch short), on either of 2 ranks."""
    blocks = TokenBlocks(stream_pack.split("train"), seq_len=4)
    for rank, (shuffle, batch, drop_last) in ((0, (True, 3, True)), (1, (False, 4, False))):
        sampler = EpochSampler(len(blocks), 0, shuffle=shuffle, seed=5, rank=rank,
                               world_size=2, pad=not shuffle)
        buffered = BufferedLoader(blocks, sampler, batch, drop_last, workers, 0,
                                  prefetch_factor=2)
        torch_loader = DataLoader(blocks, batch_size=batch, sampler=sampler,
                                  drop_last=drop_last)
        for epoch in (0, 1):
            sampler.set_epoch(epoch, 0)
            got = [rows.clone() for rows in buffered]  # a buffer is reused later
            expected = list(torch_loader)
            assert len(got) == len(expected) == len(buffered) > 1
            assert all(a.dtype == torch.int32 and a.equal(b) for a, b in zip(got, expected))
        buffered.close()


def test_a_damaged_block_read_by_a_buffer_worker_is_named_in_the_training_process(
        stream_pack, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(stream_pack.root, copy)
    ids = np.fromfile(copy / "train-00000.bin", dtype="<u2")
    ids[9] = 60000  # in the third block of 4 (+1) tokens, which starts at 8
    ids.tofile(copy / "train-00000.bin")
    split = TokenPack(copy).split("train")
    blocks = TokenBlocks(split, seq_len=4)
    loader = BufferedLoader(blocks, EpochSampler(len(blocks), 0, shuffle=False), 2, True, 1, 0)
    with pytest.raises(DataError, match="train-00000.bin at 8: id 60000 is outside the "
                                        "vocabulary"):
        list(loader)
    loader.close()


def test_documents_start_with_end_of_text_and_long_ones_are_cut_in_pieces(stream_pack):
    docs = TokenDocuments(stream_pack.split("train"), seq_len=4, eos_id=BYTE_EOS)
    pieces = [docs[i][0].tolist() for i in range(len(docs))]
    assert pieces[0] == [BYTE_EOS, ord("a"), BYTE_EOS]
    # document 5: six 'f's; with its marks 8 tokens, in pieces of 5 overlapping by one
    f = ord("f")
    sixth = [p for p in pieces if f in p]
    assert sixth == [[BYTE_EOS, f, f, f, f], [f, f, f, BYTE_EOS]]
    # every target (all tokens but each piece's first) appears once: each document's
    # letters and its closing end-of-text
    targets = sum(len(p) - 1 for p in pieces)
    assert targets == sum(d + 2 for d in range(12)) and list(docs.lengths) == [len(p) for p
                                                                               in pieces]


def test_document_batches_are_padded_and_padding_is_not_learned(stream_pack):
    docs = TokenDocuments(stream_pack.split("train"), seq_len=16, eos_id=BYTE_EOS)
    padded = pad_documents([docs[0], docs[5]])
    ids, lengths = padded["tokens"], padded["lengths"]
    assert ids.shape == (2, 9) and lengths.tolist() == [3, 8]
    task = language_modeling(torch.device("cpu"), None)
    batch = task.to_device(padded, training=True)
    assert batch.inputs.shape == (2, 8)
    assert (batch.targets[0, 2:] == IGNORE).all() and (batch.targets[0, :2] != IGNORE).all()
    assert (batch.targets[1, 7:] == IGNORE).all() and (batch.targets[1, :7] != IGNORE).all()
    logits = torch.randn(2, 8, 257)
    sums = dict(zip(task.sum_names,
                    task.sums(logits, batch, task.loss(logits, batch), True).tolist()))
    assert (sums["tokens"], sums["positions"]) == (2 + 7, 16)
    assert task.values(sums)["padding_fraction"] == pytest.approx(7 / 16)


def test_answers_are_right_only_when_every_answer_token_is():
    eq, end = ord("="), BYTE_EOS
    text = [end, *b"1+2=3", end, *b"4+5=9", end, *b"7+1=", ]  # the last answer is cut off
    ids = torch.tensor([text])
    inputs, targets = ids[:, :-1], ids[:, 1:]
    right = torch.ones_like(targets, dtype=torch.bool)
    assert answer_sums(inputs, targets, right, (eq, end)).tolist() == [2, 2]
    wrong_nine = right.clone()
    wrong_nine[0, text.index(ord("9")) - 1] = False  # the prediction of '9'
    assert answer_sums(inputs, targets, wrong_nine, (eq, end)).tolist() == [1, 2]
    wrong_question = right.clone()
    wrong_question[0, 1] = False  # a wrong '+' is not part of any answer
    assert answer_sums(inputs, targets, wrong_question, (eq, end)).tolist() == [2, 2]
    wrong_close = right.clone()
    wrong_close[0, text.index(ord("9"))] = False  # not ending the answer is wrong too
    assert answer_sums(inputs, targets, wrong_close, (eq, end)).tolist() == [1, 2]


def test_the_arithmetic_corpus_holds_true_sums():
    every = problems(12, "+-")
    assert len(every) == 2 * 13 * 13 and len(set(every)) == len(every)
    for text in every:
        question, answer = text.split("=")
        a, op, b = re.fullmatch(r"(\d+)([+*-])(\d+)", question).groups()
        assert {"+": int(a) + int(b), "-": int(a) - int(b)}[op] == int(answer)


def test_gpt_is_causal_and_ties_its_embedding():
    torch.manual_seed(0)
    model = gpt("tiny", vocab_size=50, width=32, layers=2, heads=4, context=16).eval()
    tokens = torch.randint(0, 50, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 50
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[0, :8], b[0, :8]) and not torch.allclose(a[0, 8:], b[0, 8:])
    assert model.head.weight is model.embed.weight
    assert "cos" not in model.state_dict()  # derived from the shape, not saved


# ---- training runs ---------------------------------------------------------------------------

LM = ["data.dataset=arithmetic", "data.arithmetic.num_train=3000",
      "data.arithmetic.num_val=40", "data.arithmetic.max_operand=30", "data.tokens.seq_len=32",
      "model.name=hpctrain:gpt_tiny", "model.kwargs.width=32", "model.kwargs.layers=1",
      "optim.name=adamw", "optim.lr=0.01", "optim.weight_decay=0.0", "schedule.name=constant",
      "data.num_workers=0", "tensorboard=false", "precision=fp32"]


def train_records(run: Path, kind: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


@pytest.fixture(scope="module")
def lm_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arithmetic-cache")


def test_a_tiny_language_model_learns(tmp_path, run_cli, lm_cache):
    code, out, err = run_cli("run", "tiny-lm", *LM, f"data.arithmetic.cache_dir={lm_cache}",
                             f"output_dir={tmp_path}", "run_name=lm", "train.max_steps=300",
                             "train.log_every=10", "train.batch_size=32")
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "lm" / "summary.json").read_text())
    train = train_records(tmp_path / "lm")
    # from ln(257) = 5.5 at the start (uniform over the bytes) to below 1.6
    assert train[0]["loss"] > 3.0 and train[-1]["loss"] < 1.6, [r["loss"] for r in train]
    assert summary["task"] == "language_modeling" and summary["images_per_second"] is None
    assert summary["tokens_per_second"] == pytest.approx(32 * summary["samples_per_second"])
    assert summary["best_val_loss"] < 1.8
    assert summary["best_val_perplexity"] == pytest.approx(np.exp(summary["best_val_loss"]))
    assert set(summary["final_eval"]) == {"val_loss", "val_perplexity", "val_accuracy",
                                          "val_answer_accuracy"}
    assert "tok/s" in out + err and "tokens_per_second" in out


def lm_weights(checkpoint: Path) -> dict:
    state = {"model": gpt("tiny", vocab_size=257, width=32, layers=1).state_dict()}
    dcp.load(state, checkpoint_id=checkpoint)
    return state["model"]


@pytest.mark.parametrize("batching", ["blocks", "documents"])
def test_a_language_model_resumes_bitwise(tmp_path, run_cli, lm_cache, batching):
    common = [*LM, f"data.arithmetic.cache_dir={lm_cache}", f"output_dir={tmp_path}",
              f"data.tokens.batching={batching}", "train.max_steps=12", "train.log_every=1",
              "train.batch_size=8", "checkpoint.every_steps=6", "train.eval_every_epochs=100"]
    code, _, err = run_cli("run", "tiny-lm", *common, "run_name=straight")
    assert code == 0, err[-2000:]
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    code, _, err = run_cli("run", "tiny-lm", *common, "run_name=resumed",
                           f"resume={tmp_path / 'resumed' / 'checkpoints' / 'step_00000006'}")
    assert code == 0, err[-2000:]
    straight, resumed = train_records(tmp_path / "straight"), train_records(tmp_path / "resumed")
    assert [r["loss"] for r in straight[6:]] == [r["loss"] for r in resumed[-6:]]
    a = lm_weights(tmp_path / "straight" / "checkpoints" / "step_00000012")
    b = lm_weights(tmp_path / "resumed" / "checkpoints" / "step_00000012")
    assert all(torch.equal(a[k], b[k]) for k in a)
    if batching == "documents":
        assert 0 < json.loads((tmp_path / "resumed" / "summary.json").read_text())[
            "padding_fraction"] < 1


@pytest.mark.slow
def test_the_tiny_lm_recipe_learns_to_add(tmp_path_factory):
    """The README's promise: `hpctrain run tiny-lm` gets at least 90 % of held-out answers
    entirely right, with nothing downloaded (about 100 s on two CPU cores)."""
    from conftest import run_installed

    out = tmp_path_factory.mktemp("tiny-lm")
    result = run_installed("run", "tiny-lm", f"output_dir={out}", "run_name=recipe",
                           f"data.arithmetic.cache_dir={out / 'cache'}", timeout=1500)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "recipe" / "summary.json").read_text())
    assert summary["final_eval"]["val_answer_accuracy"] >= 0.9, summary["final_eval"]
    assert summary["best_val_perplexity"] < 3.5


# ---- bad input: exit 2, the culprit named ----------------------------------------------------

def test_text_that_is_not_utf8_is_skipped_and_named_or_fatal_with_strict(tmp_path, run_cli):
    src = write_corpus(tmp_path / "src", split_folders=True)
    (src / "train" / "latin1.txt").write_bytes("café".encode("latin-1"))
    code, out, _ = run_cli("pack", "--tokens", str(src), str(tmp_path / "pack"))
    assert code == 0 and "skipped" in out and "latin1.txt: not UTF-8" in out
    assert read_documents(TokenPack(tmp_path / "pack"), "train") == [
        byte_tokenizer().encode(t) for t in TEXTS[:3]]
    code, _, err = run_cli("pack", "--tokens", "--strict", str(src), str(tmp_path / "strict"))
    assert code == 2 and "latin1.txt" in err and "not UTF-8" in err and "--strict" in err
    assert not (tmp_path / "strict" / "pack.json").exists()


@pytest.mark.parametrize("contents", [{}, {"a.txt": ""}, {"b.jsonl": "\n\n"}])
def test_a_corpus_without_text_is_refused(tmp_path, run_cli, contents):
    src = tmp_path / "src"
    src.mkdir()
    for name, text in contents.items():
        (src / name).write_text(text)
    code, _, err = run_cli("pack", "--tokens", str(src), str(tmp_path / "pack"))
    assert code == 2 and str(src) in err
    assert ("no .txt or .jsonl files" if not contents else "holds no text") in err


def test_a_jsonl_line_without_text_is_named(tmp_path, run_cli):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    code, _, err = run_cli("pack", "--tokens", "--strict", str(src), str(tmp_path / "pack"))
    assert code == 2 and "a.jsonl" in err and "line 2 has no 'text'" in err


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packed")
    texts = [f"{a} plus {b} is {a + b}." for a in range(30) for b in range(10)]
    (root / "src" / "train").mkdir(parents=True)
    (root / "src" / "val").mkdir()
    (root / "src" / "train" / "t.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts))
    (root / "src" / "val" / "v.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    pack_tokens(root / "src", root / "pack", TokenPackOptions(), workers=1, log=lambda _: None)
    return root / "pack"


def token_run(tmp_path, pack: Path, *extra: str) -> list[str]:
    return ["data.dataset=tokens", f"data.path={pack}", "data.tokens.seq_len=16",
            "model.name=hpctrain:gpt_tiny", "model.kwargs.width=32", "model.kwargs.layers=1",
            "train.max_steps=3", "train.batch_size=4", "data.num_workers=0",
            "tensorboard=false", f"output_dir={tmp_path}", *extra]


def test_a_user_token_pack_trains(tmp_path, run_cli, packed):
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, packed, "run_name=mine"))
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "mine" / "summary.json").read_text())
    assert summary["steps"] == 3 and "val_answer_accuracy" not in summary["final_eval"]


def crafted_copy(pack: Path, folder: Path, start: int, length: int) -> Path:
    """A copy of `pack` whose first training document is (start, length), re-hashed into the
    manifest: what a crafted pack looks like."""
    copy = folder / "crafted"
    shutil.copytree(pack, copy)
    manifest = json.loads((copy / "pack.json").read_text())
    entry = manifest["splits"]["train"]["index"]
    docs = np.load(copy / entry["file"])
    docs["start"][0], docs["length"][0] = start, length
    with open(copy / entry["file"], "wb") as handle:
        np.save(handle, docs)
    entry["sha256"] = hashlib.sha256((copy / entry["file"]).read_bytes()).hexdigest()
    (copy / "pack.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("start, length", [(2**64 - 2**32, 2**32 - 1), (2**64 - 1, 1),
                                           (0, 2**32 - 1), (2**63, 0)])
def test_a_document_range_past_its_shard_is_refused_whatever_the_numbers(
        tmp_path, packed, start, length):
    """start + length + 1 in uint64 wraps around: (2**64 - 2**32, 2**32 - 1) ended at 0 and
    passed, and reading the document allocated 2**32 tokens (22.7 GB before the kernel killed
    the run). The check never forms the sum."""
    with pytest.raises(DataError, match=rf"document 0 \(shard 0, tokens {start} to "
                                        rf"{start + length}\) points outside its shard"):
        TokenPack(crafted_copy(packed, tmp_path, start, length))


def test_a_token_shard_that_links_out_of_the_pack_is_refused(tmp_path, packed):
    copy = Path(shutil.copytree(packed, tmp_path / "copy"))
    name = json.loads((copy / "pack.json").read_text())["splits"]["train"]["shards"][0]["file"]
    shutil.move(copy / name, tmp_path / "elsewhere.bin")
    (copy / name).symlink_to(tmp_path / "elsewhere.bin")
    with pytest.raises(DataError, match=rf"{name} is a link to .*elsewhere.bin, outside the "
                                        "pack"):
        TokenPack(copy)


def test_a_run_on_a_crafted_token_pack_is_exit_2_under_a_memory_limit(tmp_path, packed):
    """The whole run, in a process limited to 4 GiB of address space (had the check wrapped,
    it would allocate 2**32 tokens): one line naming the document, exit 2."""
    crafted = crafted_copy(packed, tmp_path, 2**64 - 2**32, 2**32 - 1)
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "run", "tiny-lm", *token_run(tmp_path, crafted)],
        capture_output=True, text=True, timeout=300, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_AS, (4 << 30, 4 << 30)))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "document 0" in done.stderr and "points outside its shard" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("override, words", [
    ("data.tokens.seq_len=200", ["data.tokens.seq_len=200", "context", "128"]),
    ("model.kwargs.vocab_size=100", ["vocabulary of 128", "ids up to 256"]),
    ("model.name=hpctrain:resnet_small", ["resnet_small", "tokens"]),
])
def test_a_model_that_cannot_take_the_tokens_is_refused(tmp_path, run_cli, packed, override,
                                                        words):
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, packed, override))
    assert code == 2, err[-2000:]
    assert all(word in err for word in words), err
    assert "Traceback" not in err


def damaged_copy(tmp_path, packed: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    return copy


def test_a_truncated_token_shard_is_named(tmp_path, run_cli, packed):
    copy = damaged_copy(tmp_path, packed)
    shard = copy / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, copy))
    assert code == 2 and "train-00000.bin" in err and "truncated" in err


def test_batch_buffers_asked_for_documents_are_refused(tmp_path, run_cli, packed):
    """Documents are padded per batch (no fixed row to render into): data.loader=buffers is
    refused before training, in one line, exit 2."""
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, packed,
                                                        "data.tokens.batching=documents",
                                                        "data.loader=buffers"))
    assert code == 2 and "data.loader=buffers" in err and "use data.loader=auto" in err
    assert "Traceback" not in err and not list(tmp_path.rglob("summary.json"))


def test_an_id_outside_the_vocabulary_is_caught_before_the_model(tmp_path, run_cli, packed):
    copy = damaged_copy(tmp_path, packed)
    shard = copy / "train-00000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[::7] = 60000  # same size, so only reading the ids finds it
    ids.tofile(shard)
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, copy))
    assert code == 2 and "id 60000 is outside the vocabulary of 257" in err
    assert "train-00000.bin" in err


def test_an_image_pack_given_as_tokens_says_so(tmp_path, run_cli, packed):
    copy = damaged_copy(tmp_path, packed)
    manifest = json.loads((copy / "pack.json").read_text())
    (copy / "pack.json").write_text(json.dumps({**manifest, "format": "hpctrain-shards"}))
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, copy))
    assert code == 2 and "data.dataset=shards" in err


def test_a_task_that_does_not_fit_the_data_is_refused(run_cli):
    code, _, err = run_cli("config", "show", "tiny-lm", "task=image_classification")
    assert code == 2 and "task image_classification cannot learn from data.dataset=arithmetic" \
        in err


# ---- every verb on the language model ----------------------------------------------------

def test_memory_predicts_the_gpt_step_the_cpu_measures(run_cli):
    code, out, err = run_cli("memory", "tiny-lm", "device=cpu", "--gpu-memory", "8GiB",
                             "train.batch_size=16", "--measure", "--json")
    assert code == 0, err
    report = json.loads(out)
    estimate = report["estimate"]
    assert estimate["input_shape"] == [64] and estimate["parameters"] > 400_000
    measured = report["measured"]
    assert abs(measured["relative_error"]) <= 0.1 and abs(measured["peak_relative_error"]) <= 0.1


def test_profile_of_a_language_model_gives_a_verdict_and_its_mfu(tmp_path, run_cli, lm_cache,
                                                                 monkeypatch):
    """The MFU divides by the peak `hpctrain bench node` measured on this node (a CPU has no
    spec sheet, so without the measurement there is none)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    profile = ["profile", "tiny-lm", *LM, f"data.arithmetic.cache_dir={lm_cache}",
               f"output_dir={tmp_path}", "train.batch_size=8", "--steps", "3"]
    code, out, err = run_cli(*profile, "--json")
    assert code == 0, err
    verdict = json.loads(out)["verdict"]
    assert verdict["bound"] == "compute-bound" and "CPU-only trace" in verdict["reason"]
    assert "mfu" not in verdict["numbers"]
    assert run_cli("bench", "node", "--size", "256", "--megabytes", "16", "--seconds",
                   "0.05")[0] == 0
    code, out, err = run_cli(*profile)
    assert code == 0, err
    assert re.search(r"MFU \d+\.\d% of the measured fp32 peak", out), out


def test_bench_data_measures_the_token_loader_against_the_model(run_cli, lm_cache):
    code, out, err = run_cli("bench", "data", "tiny-lm", *LM,
                             f"data.arithmetic.cache_dir={lm_cache}", "train.batch_size=8",
                             "--workers", "1", "--prefetch", "2", "--seconds", "0.5",
                             "--model", "--model-steps", "6", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["unit"] == "block" and report["decode_one_core"] is None
    assert report["best"]["samples_per_second"] > 0 and report["model_samples_per_second"] > 0


def test_a_held_out_share_that_leaves_nothing_to_train_on_is_refused(tmp_path, run_cli):
    code, _, err = run_cli("run", "tiny-lm", "data.arithmetic.max_operand=3",
                           "data.arithmetic.num_val=16", "data.arithmetic.operations=+",
                           f"data.arithmetic.cache_dir={tmp_path}", f"output_dir={tmp_path}")
    assert code == 2 and "data.arithmetic.num_val=16 leaves no problem for training" in err
    assert "Traceback" not in err


# ---- Hugging Face transformers causal LMs from a local config -------------------------------

@pytest.fixture(scope="module")
def hf_config(tmp_path_factory) -> Path:
    """A one-layer Llama config saved as a user would (nothing downloaded)."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("llama")
    LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                vocab_size=320, bos_token_id=None, eos_token_id=None).save_pretrained(folder)
    return folder


HF_LM = [o for o in LM if not o.startswith("model.")]  # the data and training of LM


def test_a_transformers_causal_lm_trains_from_a_local_config(tmp_path, run_cli, lm_cache,
                                                             hf_config):
    code, out, err = run_cli("run", "tiny-lm", *HF_LM, f"data.arithmetic.cache_dir={lm_cache}",
                             f"output_dir={tmp_path}", "run_name=hf", "train.max_steps=60",
                             "train.log_every=10", "train.batch_size=16",
                             f"model.name=hf:{hf_config}", "model.kwargs.num_hidden_layers=2")
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "hf" / "summary.json").read_text())
    train = train_records(tmp_path / "hf")
    assert summary["task"] == "language_modeling" and summary["steps"] == 60
    assert train[-1]["loss"] < train[0]["loss"] - 1.0, [r["loss"] for r in train]
    assert "(0.12 M parameters)" in out + err  # two layers, as model.kwargs asked


def test_model_flops_are_palms_for_the_whole_model(hf_config):
    """6N + 12·L·H·Q·T per token (PaLM, appendix B): N every parameter that multiplies (the
    GPT's tied embedding once, as the output layer; Llama's input table, only looked up,
    left out), L·H·Q from the model; a model of unknown shape counts 6N and says so."""
    from hpctrain.models.gpt import gpt
    from hpctrain.models.huggingface import causal_lm
    from hpctrain.train.hardware.mfu import model_flops

    model = gpt("124m", vocab_size=50304)
    flops = model_flops(model)
    assert flops.parameters == flops.multiplied == sum(p.numel() for p in model.parameters())
    assert flops.attention == (12, 12, 64) and flops.formula.startswith("6N + 12LHQT")
    assert flops.per_token(1024) == 6 * flops.multiplied + 12 * 12 * 12 * 64 * 1024
    llama = model_flops(causal_lm(str(hf_config), {}))
    assert llama.attention == (1, 4, 16)
    assert llama.parameters - llama.multiplied == 320 * 64  # the input embedding table
    plain = model_flops(torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3)))
    assert (plain.parameters, plain.multiplied, plain.attention) == (55, 15, None)
    assert plain.per_token(1024) == 6 * 15 and "left out" in plain.formula


@pytest.mark.parametrize("override, why", [
    ("model.kwargs.vocab_size=100", "has a vocabulary of 100 but the token data holds ids up "
                                    "to 256"),
    ("model.kwargs.max_position_embeddings=16", "is longer than the context of hf:"),
    ("model.kwargs.n_layers=2", "model.kwargs.n_layers: the llama config has no field"),
    ("model.name=hf:/nonexistent", "no config.json there"),
])
def test_a_transformers_model_that_cannot_take_the_data_is_refused(tmp_path, run_cli, lm_cache,
                                                                   hf_config, override, why):
    code, _, err = run_cli("run", "tiny-lm", *HF_LM, f"data.arithmetic.cache_dir={lm_cache}",
                           f"output_dir={tmp_path}", "train.max_steps=2",
                           f"model.name=hf:{hf_config}", override)
    assert code == 2 and why in err and "Traceback" not in err, err[-2000:]


def test_memory_predicts_a_transformers_model_the_cpu_measures(run_cli, hf_config):
    code, out, err = run_cli("memory", "tiny-lm", f"model.name=hf:{hf_config}", "device=cpu",
                             "--gpu-memory", "8GiB", "train.batch_size=16", "--measure",
                             "--json")
    assert code == 0, err
    measured = json.loads(out)["measured"]
    assert abs(measured["relative_error"]) <= 0.1 and abs(measured["peak_relative_error"]) <= 0.1
