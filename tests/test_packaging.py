"""What the installed package says about itself: one version, written once; what importing
it loads."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import tokstream

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_the_installed_metadatas():
    assert tokstream.__version__ == importlib.metadata.version("tokstream")


def test_the_version_is_written_once_in_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    (version,) = re.findall(r'^version = "([^"]+)"$', pyproject, flags=re.MULTILINE)
    assert version == tokstream.__version__
    literal = re.compile(rf"""["']{re.escape(version)}["']""")
    for source in (ROOT / "src" / "tokstream").rglob("*.py"):
        assert not literal.search(source.read_text()), f"{source} writes the version again"


def test_reading_local_files_imports_neither_asyncio_nor_the_object_store_client(tmp_path):
    # Every rank and DataLoader worker imports tokstream: the remote client (asyncio, tens of
    # milliseconds) loads with the first URL, not with the package or an open of local files.
    np.save(tmp_path / "a.npy", np.arange(100, dtype=np.uint16))
    code = (
        "import sys, tokstream\n"
        f"corpus = tokstream.open_tokens({str(tmp_path / '*.npy')!r})\n"
        "next(tokstream.stream_token_source(corpus, 8, 2))\n"
        "print(sorted(m for m in ('asyncio', 'tokstream.shards.remote._client', "
        "'tokstream.shards.remote._session', 'tokstream.shards.remote._open') "
        "if m in sys.modules))\n"
        "from tokstream.shards.remote import RemoteOptions\n"
        "print(RemoteOptions.__module__)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == ["[]", "tokstream.shards.remote._client"]
