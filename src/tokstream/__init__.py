"""tokstream: exact, fast ``(context windows, next tokens)`` micro-batches for LM training.

The fast path (:func:`stream_token_source`) yields byte-identical batches to the pure-NumPy
reference (:func:`tokstream.reference.stream_token_source`), assembling them with a compiled
kernel instead of one ``np.stack`` per batch.
"""

from typing import Any

try:
    from tokstream import _windows
except ImportError as exc:  # pragma: no cover - exercised only by a broken install
    raise ImportError(
        "tokstream's compiled kernel (tokstream._windows) could not be imported. tokstream has "
        "no pure-Python fallback: install a wheel, or build from source with a C compiler "
        "(`pip install .`). Original error: " + str(exc)
    ) from exc

from tokstream.corpus import Corpus
from tokstream.files import open_tokens
from tokstream.mixture import Mixture, mix
from tokstream.split import split
from tokstream.stream import TokenStream, stream_token_source
from tokstream.writing import write_tokens

__all__ = [
    "Corpus",
    "Mixture",
    "TokenStream",
    "__version__",
    "mix",
    "open_tokens",
    "split",
    "stream_token_source",
    "write_tokens",
]

del _windows


def __getattr__(name: str) -> Any:
    # The version is written once, in pyproject.toml, and read from the installed package's
    # metadata on first use: importlib.metadata costs every process that imports tokstream
    # (each rank and DataLoader worker) tens of milliseconds it rarely needs.
    if name == "__version__":
        from importlib.metadata import version

        return version("tokstream")
    raise AttributeError(f"module 'tokstream' has no attribute {name!r}")
