"""Old import paths still work for one deprecation period, warning and naming the new path."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("tokstream.prefetch", "tokstream._prefetch", "Prefetcher"),
        ("tokstream.readahead", "tokstream._readahead", "WINDOWS_AHEAD"),
        ("tokstream.baselines", "tokstream.bench.baselines", "PATHS"),
    ],
)
def test_a_moved_module_warns_and_forwards_every_name(old, new, name, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated .* import from {new} "):
        alias = importlib.import_module(old)
    target = importlib.import_module(new)
    assert getattr(alias, name) is getattr(target, name)
    assert name in dir(alias)
    with pytest.raises(AttributeError):
        alias.no_such_name  # noqa: B018


def test_the_command_line_and_the_bench_harness_keep_their_import_paths():
    from tokstream import bench, cli
    from tokstream.bench import harness

    assert callable(cli.main) and bench.SHAPES is harness.SHAPES
