"""What the installed package says about itself: one version, written once."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

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
