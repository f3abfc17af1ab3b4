"""The README's trust and failure model: every line names tests, and every test it names exists."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_line_of_the_failure_model_names_existing_tests():
    text = (REPO / "README.md").read_text()
    section = text.split("## Trust and failure model", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| What")]
    assert len(rows) >= 8  # results, baselines, lock folder, identity, damage, disk, rank, node
    for row in rows:
        refs = re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", row)
        assert refs, f"no test named in: {row}"
        current = None
        for path, name in refs:
            current = path or current  # `::name` continues the file named before it
            src = (REPO / current).read_text()
            assert re.search(rf"^def {name}\(", src, re.M), f"{current}::{name} does not exist"
