"""Where a corpus' tokens come from, behind one interface: a ``ShardSource`` each.

- :mod:`~tokstream.shards.source`: the interface (``readable``: the bytes a kernel call reads,
  made readable until released), :class:`~tokstream.shards.source.MappedShards` (local files
  mapped on first use, a bounded number kept) and ``Corpus.shards`` of a lazily read corpus;
- :mod:`~tokstream.shards.filemap`: read-only maps of token files that keep no file
  descriptor open, and the file region an array maps (to pickle it by file);
- :mod:`~tokstream.shards.manifest`: the shards a manifest lists, each mapped on first read
  and checked against its entry;
- :mod:`~tokstream.shards.joined`: several corpora's shards as one lazily read corpus;
- :mod:`tokstream.shards.remote`: token files in object storage (the ``remote`` extra).
"""
