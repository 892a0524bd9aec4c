"""Language modelling: token packs (round trip, resume, damage), the two batchings, answer
grading, and training runs (loss falls, bitwise resume, 2 processes equal 1).

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_language.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.data.tokens import token_packing
from hpctrain.data.tokens.arithmetic import problems
from hpctrain.data.tokens.token_pack import TokenBlocks, TokenDocuments, TokenPack, pad_documents
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens
from hpctrain.data.tokens.tokenizer import BYTE_EOS, byte_tokenizer, huggingface_tokenizer
from hpctrain.errors import DataError
from hpctrain.models.gpt import gpt
from hpctrain.tasks.language_modeling import IGNORE, answer_sums, language_modeling
from token_data import crafted_copy, hf_config, packed, stream_pack

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


def test_blocks_tile_the_stream_with_one_token_of_overlap(stream_pack):
    split = stream_pack.split("train")
    stream = split.shard(0).tolist()
    blocks = TokenBlocks(split, seq_len=8)
    assert len(blocks) == (len(stream) - 1) // 8
    for i in range(len(blocks)):
        assert blocks[i].tolist() == stream[i * 8:i * 8 + 9]


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


# ---- Hugging Face transformers causal LMs from a local config -------------------------------


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


def test_memory_predicts_a_transformers_model_the_cpu_measures(run_cli, hf_config):
    code, out, err = run_cli("memory", "tiny-lm", f"model.name=hf:{hf_config}", "device=cpu",
                             "--gpu-memory", "8GiB", "train.batch_size=16", "--measure",
                             "--json")
    assert code == 0, err
    measured = json.loads(out)["measured"]
    assert abs(measured["relative_error"]) <= 0.1 and abs(measured["peak_relative_error"]) <= 0.1
