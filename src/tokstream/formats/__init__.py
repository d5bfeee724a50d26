"""One module per token file format: how each is laid out, read and written.

:mod:`tokstream.files` is the public face (:func:`~tokstream.files.open_tokens`,
:func:`~tokstream.files.detect_format`, :func:`~tokstream.writing.write_tokens`); the modules here
know one layout each and hand back :class:`~tokstream.formats.common.Shard` objects: a read-only
token array and, where the format records them, the document boundaries inside it;
:mod:`~tokstream.formats.table` lists the formats and reads a path by its format.
"""
