"""Text to token files: the preparation step before :func:`tokstream.open_tokens`.

:func:`tokenize_files` reads documents from text files (one per line, or one per file), JSON
Lines and Parquet (a text field), encodes each with a Hugging Face ``tokenizers`` JSON file or a
tiktoken encoding available locally, appends the end-of-sequence token, and writes one shard
per range of about ``shard_bytes`` input bytes into a directory that :func:`tokstream.open_tokens`
opens with its documents (:mod:`tokstream.formats.tokenized`).

The output depends only on the inputs and the options, never on the engine, ``workers`` nor on
interruptions: each shard is made by a pure task from its range of the inputs
(:mod:`tokstream.tokenize.task`), in this process, worker processes or on Ray, and the directory
(:mod:`tokstream.tokenize.output`) records each shard made, so a run that is interrupted or
killed is finished by running it again, making only the shards it had not made. Nothing is
downloaded: a tiktoken encoding must already be in tiktoken's local cache.
"""

from tokstream.tokenize.job import (
    DEFAULT_EOS,
    DEFAULT_SHARD_BYTES,
    FORMATS,
    Progress,
    Result,
    tokenize_files,
)

__all__ = ["DEFAULT_EOS", "DEFAULT_SHARD_BYTES", "FORMATS", "Progress", "Result", "tokenize_files"]
