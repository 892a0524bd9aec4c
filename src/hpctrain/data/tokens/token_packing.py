"""`hpctrain pack --tokens SRC DST`: a folder of .txt and .jsonl files into a token pack
(format: token_pack.py).

A .txt file is one document; a .jsonl file holds one document per line, in its `text` field.
The source files are grouped into jobs of about `shard_bytes` of text, tokenized in parallel,
one process per job; each job writes one shard per split under a temporary name, then its
index fragment and a statistics file that marks it finished, so an interrupted pack resumes
(the same plan fingerprint as image packs: source files, sizes, times and options). With
train/ and val/ folders in SRC those are the splits; otherwise each document goes to val with
probability `val_fraction`, drawn from a hash of its file's path inside SRC and its position
(so the split depends neither on the number of processes nor on where the corpus lies). The manifest is written last.

A file that is not UTF-8 is skipped and named (`--strict`: the pack stops there); a corpus
with no text at all is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from hpctrain.data.packs import (MANIFEST, PLAN, HashingFile, file_sha256, index_name,
                                 leftovers, prepare_destination, read_fragment, run_jobs,
                                 save_npy)
from hpctrain.data.tokens.tokenizer import Tokenizer, byte_tokenizer, huggingface_tokenizer
from hpctrain.data.tokens.token_pack import DOC_DTYPE, FORMAT, VERSION, shard_name, token_dtype
from hpctrain.errors import DataError
from hpctrain.progress_bar import progress_bar
from hpctrain.writers import write_whole

SUFFIXES = (".txt", ".jsonl")


@dataclass
class TokenPackOptions:
    tokenizer: str | None = None  # a Hugging Face tokenizer.json (or its folder); None: bytes
    val_fraction: float = 0.01
    shard_bytes: int = 256 << 20  # of source text per job (and so per shard)
    seed: int = 0


@dataclass
class TokenJob:
    number: int
    files: list[tuple[str, str]]  # (path, split or "" for the hashed split)
    dst: str
    options: TokenPackOptions
    strict: bool
    src: str  # the corpus folder: the hashed split draws on paths inside it


@dataclass
class TokenResult:
    number: int
    splits: dict = field(default_factory=dict)  # split -> {documents, tokens, bytes, sha256}
    skipped: list = field(default_factory=list)  # [path, why]
    source_bytes: int = 0


def source_files(src: Path) -> list[tuple[str, str]]:
    """(path, split) of every .txt and .jsonl file under `src`, sorted; the split is the
    train/ or val/ folder it lies in, or "" when SRC has no such folders."""
    if not src.is_dir():
        raise DataError(f"pack --tokens: {src} is not a folder of .txt or .jsonl files")
    folders = [name for name in ("train", "val") if (src / name).is_dir()]
    if folders and "train" not in folders:
        raise DataError(f"pack --tokens: {src} has val/ but no train/ folder")
    roots = [(src / name, name) for name in folders] or [(src, "")]
    files = [(str(path), split) for root, split in roots
             for path in sorted(root.rglob("*")) if path.suffix in SUFFIXES and path.is_file()]
    if not files:
        raise DataError(f"pack --tokens: no .txt or .jsonl files under {src}")
    return files


def documents(path: str):
    """The texts of one source file; UnicodeDecodeError or ValueError when it is damaged."""
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".txt"):
            yield handle.read()
            return
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"line {number} is not JSON") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"line {number} has no 'text' string field")
            yield record["text"]


def _to_val(path: str, number: int, job: TokenJob) -> bool:
    inside = os.path.relpath(path, job.src)
    digest = hashlib.blake2b(f"{job.options.seed}:{inside}:{number}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") / 2**64 < job.options.val_fraction


def _tokenizer(options: TokenPackOptions) -> Tokenizer:
    return huggingface_tokenizer(options.tokenizer) if options.tokenizer else byte_tokenizer()


def _fragment(dst: Path, number: int, suffix: str) -> Path:
    return dst / f".job-{number:05d}.{suffix}"


def write_job(job: TokenJob) -> TokenResult:
    """Tokenize one job's files into one shard per split; the statistics file, renamed last,
    marks the job finished."""
    dst, tokenizer = Path(job.dst), _tokenizer(job.options)
    dtype = token_dtype(tokenizer.vocab_size)
    result, outputs, records = TokenResult(job.number), {}, {}

    def output(split: str) -> HashingFile:
        if split not in outputs:
            outputs[split] = HashingFile(dst / shard_name(split, job.number))
            records[split] = []
        return outputs[split]

    try:
        for path, fixed_split in job.files:
            result.source_bytes += os.path.getsize(path)
            try:
                texts = list(documents(path))
            except (UnicodeDecodeError, ValueError) as err:
                why = (f"not UTF-8 text (byte {err.start}: {err.reason})"
                       if isinstance(err, UnicodeDecodeError) else str(err))
                if job.strict:
                    raise DataError(f"pack --tokens: {path}: {why} (--strict)") from None
                result.skipped.append([path, why])
                continue
            for number, text in enumerate(texts):
                ids = tokenizer.encode(text)
                if not ids:
                    continue
                split = fixed_split or ("val" if _to_val(path, number, job)
                                        else "train")
                out = output(split)
                start = out.size // dtype.itemsize
                out.write(np.array(ids + [tokenizer.eos_id], dtype=dtype).tobytes())
                records[split].append((job.number, start, len(ids)))
    except BaseException:
        for out in outputs.values():
            out.discard()
        raise
    for split, out in outputs.items():
        save_npy(_fragment(dst, job.number, f"{split}.npy"),
                 np.array(records[split], dtype=DOC_DTYPE))
        out.keep()
        result.splits[split] = {"documents": len(records[split]),
                                "tokens": out.size // dtype.itemsize, "bytes": out.size,
                                "sha256": out.digest.hexdigest()}
    write_whole(_fragment(dst, job.number, "json"), json.dumps(asdict(result)))
    return result


def _finished(dst: Path, job: TokenJob) -> TokenResult | None:
    try:  # an unreadable fragment is a job to do again
        result = TokenResult(**read_fragment(_fragment(dst, job.number, "json")))
    except (OSError, ValueError, TypeError):
        return None
    shards_there = all((dst / shard_name(split, job.number)).is_file()
                       for split in result.splits)
    return result if shards_there else None


def plan_jobs(files: list[tuple[str, str]], src: Path, dst: Path, options: TokenPackOptions,
              strict: bool) -> list[TokenJob]:
    jobs, group, size = [], [], 0
    for path, split in files:
        group.append((path, split))
        size += os.path.getsize(path)
        if size >= options.shard_bytes:
            jobs.append(TokenJob(len(jobs), group, str(dst), options, strict, str(src)))
            group, size = [], 0
    if group:
        jobs.append(TokenJob(len(jobs), group, str(dst), options, strict, str(src)))
    return jobs


def _fingerprint(files, options: TokenPackOptions, tokenizer: Tokenizer) -> str:
    stats = [(path, split, os.path.getsize(path), os.path.getmtime(path))
             for path, split in files]
    tokenizer_hash = file_sha256(tokenizer.file) if tokenizer.file else "bytes"
    text = json.dumps([FORMAT, VERSION, stats, asdict(options), tokenizer_hash])
    return hashlib.sha256(text.encode()).hexdigest()


def pack_tokens(src: Path, dst: Path, options: TokenPackOptions, workers: int | None = None,
                strict: bool = False, overwrite: bool = False, log=print) -> dict:
    """Tokenize `src` into the token pack `dst`; its manifest."""
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    started = time.perf_counter()
    tokenizer = _tokenizer(options)  # a bad --tokenizer fails before anything is written
    files = source_files(src)
    resumed = prepare_destination(dst, _fingerprint(files, options, tokenizer), overwrite)
    jobs = plan_jobs(files, src, dst, options, strict)
    done = {job.number: r for job in jobs if (r := _finished(dst, job)) is not None}
    todo = [job for job in jobs if job.number not in done]
    if resumed:
        log(f"pack: resuming {dst}: {len(done)} of {len(jobs)} jobs already written")
    total = sum(os.path.getsize(path) for job in todo for path, _ in job.files)
    with progress_bar(f"tokenizing {len(todo)} jobs", total) as advance:
        for result in run_jobs(write_job, todo, workers):
            done[result.number] = result
            advance(result.source_bytes)
    manifest = _write_manifest(dst, src, tokenizer, jobs, done, options)
    manifest["seconds"] = round(time.perf_counter() - started, 1)
    return manifest


def _write_manifest(dst: Path, src: Path, tokenizer: Tokenizer, jobs, done, options) -> dict:
    results = [done[job.number] for job in jobs]
    splits = sorted({split for r in results for split in r.splits}, key=["train", "val"].index)
    skipped = [s for r in results for s in r.skipped]
    if sum(r.splits.get("train", {}).get("tokens", 0) for r in results) == 0:
        named = f" ({len(skipped)} file(s) skipped, e.g. {skipped[0][0]}: {skipped[0][1]})" \
            if skipped else ""
        drawn = sum(r.splits.get("val", {}).get("documents", 0) for r in results)
        if drawn:
            named = (f": its {drawn} document(s) all went to val (val_fraction "
                     f"{options.val_fraction}); give more documents, or train/ and val/ folders")
        raise DataError(f"pack --tokens: the corpus in {src} holds no text for training{named}")
    if tokenizer.file is not None:
        shutil.copyfile(tokenizer.file, dst / "tokenizer.json")
    manifest = {"format": FORMAT, "version": VERSION, "pack_id": uuid.uuid4().hex,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "source": str(src),
                "tokenizer": tokenizer.describe(),
                "dtype": token_dtype(tokenizer.vocab_size).str, "options": asdict(options),
                "splits": {}, "skipped": skipped}
    for split in splits:
        mine = [r for r in results if split in r.splits]
        fragments = []
        for position, result in enumerate(mine):  # a job's shard is the split's position-th
            fragment = np.load(_fragment(dst, result.number, f"{split}.npy"))
            fragment["shard"] = position
            fragments.append(fragment)
        index = np.concatenate(fragments)
        save_npy(dst / index_name(split), index)
        manifest["splits"][split] = {
            "documents": int(len(index)),
            "tokens": int(sum(r.splits[split]["tokens"] for r in mine)),
            "index": {"file": index_name(split), "sha256": file_sha256(dst / index_name(split))},
            "shards": [{"file": shard_name(split, r.number), **{k: r.splits[split][k] for k in
                                                                ("tokens", "bytes", "sha256")}}
                       for r in mine]}
    write_whole(dst / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    for leftover in [*dst.glob(".job-*"), *leftovers(dst), dst / PLAN]:
        leftover.unlink(missing_ok=True)
    return manifest


def describe(manifest: dict) -> str:
    """What `hpctrain pack --tokens` prints."""
    tok = manifest["tokenizer"]
    lines = [f"packed {manifest['source']} in {manifest.get('seconds', 0):.1f} s (token pack "
             f"{manifest['pack_id'][:8]}, {tok['kind']} tokenizer, vocabulary "
             f"{tok['vocab_size']:,}, {manifest['dtype']}):"]
    for split, entry in manifest["splits"].items():
        lines.append(f"  {split}: {entry['documents']:,} documents, {entry['tokens']:,} tokens "
                     f"in {len(entry['shards'])} shard(s)")
    for path, why in manifest["skipped"][:10]:
        lines.append(f"  skipped {path}: {why}")
    if len(manifest["skipped"]) > 10:
        lines.append(f"  ... and {len(manifest['skipped']) - 10} more skipped (all listed in "
                     "pack.json)")
    return "\n".join(lines)
