"""Tokenizers for token packs: byte-level (nothing to download) or a Hugging Face tokenizer.

Byte-level: ids 0-255 are the UTF-8 bytes of the text, 256 ends a document; any text encodes,
and a model over it needs no vocabulary file. A Hugging Face tokenizer comes from a local
`tokenizer.json` (or a folder holding one) through the `tokenizers` package (the `text`
extra); the pack keeps a copy, so that the pack alone says how to read its ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import ConfigError, DataError

BYTE_EOS = 256
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]", "<|end_of_text|>")


@dataclass
class Tokenizer:
    kind: str  # bytes | huggingface
    vocab_size: int
    eos_id: int
    file: Path | None = None  # huggingface: its tokenizer.json
    _backend: object = field(default=None, repr=False)

    def encode(self, text: str) -> list[int]:
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        if self.kind == "bytes":
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return self._backend.decode(list(ids))

    def describe(self) -> dict:
        """What the pack's manifest records of its tokenizer."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


def byte_tokenizer() -> Tokenizer:
    return Tokenizer("bytes", BYTE_EOS + 1, BYTE_EOS)


def huggingface_tokenizer(path: Path | str) -> Tokenizer:
    """The tokenizer in `path` (a tokenizer.json, or a folder holding one)."""
    path = Path(path).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"--tokenizer {path}: no tokenizer.json there; give the file, or the "
                          "folder of a Hugging Face tokenizer saved with save_pretrained")
    try:
        from tokenizers import Tokenizer as Backend
    except ImportError:
        raise ConfigError("--tokenizer needs the tokenizers package: pip install "
                          '"hpctrain[text]"') from None
    try:
        backend = Backend.from_file(str(file))
    except Exception as err:  # the Rust side raises plain Exceptions
        raise DataError(f"--tokenizer {file}: not a tokenizer file ({err})") from None
    vocab = backend.get_vocab(with_added_tokens=True)
    eos = next((vocab[name] for name in EOS_NAMES if name in vocab), None)
    if eos is None:
        raise DataError(f"--tokenizer {file}: has none of the end-of-text tokens "
                        f"{', '.join(EOS_NAMES)}; documents need one to be separated")
    return Tokenizer("huggingface", backend.get_vocab_size(with_added_tokens=True), eos, file,
                     backend)
