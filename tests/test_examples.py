"""examples/sft.py, short: it fine-tunes, and a run resumed from its checkpoint is identical."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sft.py"


def test_the_sft_example_learns_and_resumes_exactly(tmp_path):
    spec = importlib.util.spec_from_file_location("sft_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "16", "--resume-at", "7", "--work", str(tmp_path)])
    assert result["resumed"] == result["whole"] and len(result["whole"]) == 16
    assert result["whole"][-1] < result["whole"][0]
    assert 0 < result["trained"] < result["tokens"]
