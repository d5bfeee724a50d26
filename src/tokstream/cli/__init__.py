"""The ``tokstream`` command line (also ``python -m tokstream``): :func:`main`.

One module per command (``_bench``, ``_inspect`` with ``_inspect_step``, ``_convert``,
``_tokenize``, ``_manifest``), each with its parser (``add_parser``) and its handler (``run``);
``_main`` assembles them. Handlers raise;
:func:`main` alone decides what reaches stdout and stderr and the exit code: 0 on success, 2 for a
usage error (argparse's convention), 1 for any other expected error (a bad file, a value the API
rejects, a missing optional dependency), reported as one line on stderr without a traceback.
"""

from tokstream.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
