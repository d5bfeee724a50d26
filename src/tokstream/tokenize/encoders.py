"""The tokenizers ``tokstream tokenize`` encodes with: a ``tokenizers`` JSON file or tiktoken.

Nothing is ever downloaded: a tiktoken encoding must already be in tiktoken's local cache, and a
missing one is a clear error. Only a tokenizer's spec crosses into worker processes; each loads
the tokenizer once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tokstream import _validate
from tokstream._extras import install_hint


class Encoder:
    """A tokenizer loaded from its spec: a ``tokenizers`` JSON file or a tiktoken encoding name.

    Only the spec crosses into worker processes; each loads the tokenizer once.
    """

    # Set by the loader of the tokenizer's kind.
    fingerprint: str
    max_id: int
    token_to_id: Callable[[str], int | None]
    has_id: Callable[[int], bool]
    _encode: Callable[[list[str]], list[list[int]]]

    def __init__(self, spec: str) -> None:
        self.spec = spec
        path = Path(spec)
        if path.is_file():
            self._load_tokenizers_json(path)
        elif os.sep in spec or spec.endswith(".json"):
            raise FileNotFoundError(2, "tokenizer file not found", spec)
        else:
            self._load_tiktoken(spec)

    def _load_tokenizers_json(self, path: Path) -> None:
        try:
            import tokenizers
        except ImportError:
            raise ImportError(
                f"a tokenizers JSON file needs the tokenizers package: {install_hint('tokenize')}"
            ) from None
        try:
            tokenizer = tokenizers.Tokenizer.from_file(os.fspath(path))
        except Exception as exc:  # the Rust side raises plain Exceptions
            raise ValueError(f"tokenizer {path}: not a tokenizers JSON file: {exc}") from None
        try:
            # Text is text: a special token's text inside a document (a literal
            # "<|endoftext|>") is encoded as ordinary text, never as that token.
            tokenizer.encode_special_tokens = True
        except AttributeError:
            raise ImportError(
                "tokstream tokenize needs tokenizers>=0.19 (Tokenizer.encode_special_tokens)"
            ) from None
        self.fingerprint = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        vocabulary = tokenizer.get_vocab(with_added_tokens=True)
        # The largest id, not the count: a vocabulary may leave ids unused.
        self.max_id = max(vocabulary.values(), default=0)
        self.token_to_id = tokenizer.token_to_id
        self.has_id = lambda id: tokenizer.id_to_token(id) is not None
        self._encode = lambda texts: [e.ids for e in tokenizer.encode_batch(texts)]

    def _load_tiktoken(self, name: str) -> None:
        try:
            import tiktoken
            import tiktoken.load
        except ImportError:
            raise ImportError(
                f"tokenizer {name!r} is no file; as a tiktoken encoding name it needs tiktoken "
                "(pip install tiktoken) with the encoding in its local cache"
            ) from None

        def refuse_download(location: str) -> bytes:
            raise ValueError(
                f"tiktoken encoding {name!r} is not in tiktoken's local cache (it would be "
                f"fetched from {location}); tokstream never downloads: put the file in "
                "TIKTOKEN_CACHE_DIR, or pass a tokenizers JSON file"
            )

        with _patched(tiktoken.load, "read_file", refuse_download):
            try:
                encoding = tiktoken.get_encoding(name)
            except ValueError as exc:
                if "tiktoken's local cache" in str(exc):
                    raise
                raise ValueError(f"tokenizer {name!r}: no such file or tiktoken encoding") from None
        self.fingerprint = f"tiktoken:{name}"
        self.max_id = encoding.max_token_value

        def has_id(id: int) -> bool:
            try:
                encoding.decode_single_token_bytes(id)
            except KeyError:
                return False
            return True

        self.has_id = has_id

        def token_to_id(text: str) -> int | None:
            try:
                found: int = encoding.encode_single_token(text)
            except KeyError:
                return None
            return found

        self.token_to_id = token_to_id
        # One thread: encode_ordinary_batch would start 8 (a job's workers are its cores).
        self._encode = lambda texts: [encoding.encode_ordinary(text) for text in texts]

    def encode(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, special tokens' texts in it encoded as plain text.

        For a tokenizers file, ``tokenizer.encode(text).ids`` with ``encode_special_tokens``
        set; for tiktoken, ``encode_ordinary``.
        """
        return self._encode(texts)

    def eos_id(self, eos: int | str | None) -> int | None:
        """``eos`` as a token id: an id is checked against the vocabulary, a text looked up."""
        if eos is None:
            return None
        if isinstance(eos, str):
            found = self.token_to_id(eos)
            if found is None:
                raise ValueError(
                    f"tokenizer {self.spec}: no token {eos!r} to end documents with; pass the "
                    "eos token's text or id (--eos), or none (--no-eos)"
                )
            return int(found)
        eos = _validate.exact_int(eos, "eos")
        if not (0 <= eos <= self.max_id and self.has_id(eos)):
            raise ValueError(f"eos id {eos} is no token of tokenizer {self.spec}")
        return eos


#: Read by ``tokenizers`` at every ``encode_batch``: "false" encodes on the calling thread only.
PARALLELISM = "TOKENIZERS_PARALLELISM"


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """``tokenizers`` encodes on the calling thread while the block runs; the caller's setting
    is restored after. A job's workers are the cores it uses: a worker encoding on every core
    would slow the others (and ``--workers 1`` would not mean one core)."""
    before = os.environ.get(PARALLELISM)
    os.environ[PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARALLELISM, None)
        else:
            os.environ[PARALLELISM] = before


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
