"""Deprecated alias of :mod:`tokstream._readahead`, the stream's OS read-ahead policy (internal)."""

from tokstream._deprecated import moved

__getattr__, __dir__ = moved(__name__, "tokstream._readahead", "the read-ahead policy is internal")
