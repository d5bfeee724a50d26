"""Deprecated alias of :mod:`tokstream.bench.baselines`, the paths every benchmark times."""

from tokstream._deprecated import moved

__getattr__, __dir__ = moved(__name__, "tokstream.bench.baselines", "the baselines moved")
