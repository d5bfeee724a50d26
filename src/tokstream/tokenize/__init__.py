"""Text to token files: the preparation step before :func:`tokstream.open_tokens`.

:func:`tokenize_files` reads documents from text files (one per line, or one per file), JSON
Lines and Parquet (a text field), encodes each with a Hugging Face ``tokenizers`` JSON file or a
tiktoken encoding available locally, appends the end-of-sequence token, and writes shards of at
most ``shard_tokens`` tokens (a longer document gets a shard of its own) into a directory that
:func:`tokstream.open_tokens` opens with its documents (:mod:`tokstream.formats.tokenized`).

The output depends only on the inputs and the options, never on ``workers`` nor on
interruptions: documents are encoded in batches by worker processes but written in input order,
and the directory (:mod:`tokstream.tokenize.output`) records after every batch how far it is
valid, so a run that is interrupted or killed is finished by running it again, redoing at most
a batch. Nothing is downloaded: a tiktoken encoding must already be in tiktoken's local cache.
"""

from tokstream.tokenize.job import (
    DEFAULT_EOS,
    DEFAULT_SHARD_TOKENS,
    FORMATS,
    Progress,
    Result,
    tokenize_files,
)

__all__ = ["DEFAULT_EOS", "DEFAULT_SHARD_TOKENS", "FORMATS", "Progress", "Result", "tokenize_files"]
