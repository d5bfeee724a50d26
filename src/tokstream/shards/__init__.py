"""Where a corpus' tokens come from, behind one interface: :mod:`tokstream.shards.source`.

- :mod:`~tokstream.shards.source`: ``ShardSource`` (the bytes a kernel call reads, made
  readable until released), ``Residency`` (bytes fetched before and ahead of a call),
  ``MappedShards`` (local files mapped on first use, a bounded number kept), and what the rest
  of the package calls (``present``, ``residency_of``, ``reads_object_storage``);
- :mod:`~tokstream.shards.filemap`: read-only maps of token files that keep no file
  descriptor open, and the file region an array maps (to pickle it by file);
- :mod:`~tokstream.shards.manifest`: the shards a manifest lists, each mapped on first read
  and checked against its entry;
- :mod:`~tokstream.shards.joined`: several corpora's shards as one lazily read corpus;
- :mod:`~tokstream.shards.url`: what names object storage;
- :mod:`tokstream.shards.remote`: token files in object storage (the ``remote`` extra), which
  nothing outside it imports but :func:`tokstream.open_tokens` given a URL.
"""
