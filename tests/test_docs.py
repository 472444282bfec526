"""Docs that are generated from the code stay in sync with it."""
from pathlib import Path

from stitchml.tools.opstable import table

ROOT = Path(__file__).resolve().parents[1]


def test_ops_table_matches_the_rule_registry():
    assert (ROOT / "docs" / "OPS.md").read_text().strip() == table().strip(), \
        "regenerate with: python -m stitchml.tools.opstable > docs/OPS.md"


def test_readme_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
