"""Deprecated alias of :mod:`tokstream._prefetch`, the stream's background thread (internal)."""

from tokstream._deprecated import moved

__getattr__, __dir__ = moved(__name__, "tokstream._prefetch", "the prefetch thread is internal")
