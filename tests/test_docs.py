"""The documentation states the present: the benchmark tables are what their committed results
give, the README stays short, every relative link in the README and ``docs/`` resolves, and no
file cites a design document that is not in the repository (``docs/`` holds the design)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from benchmarks import readme

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 400
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_generated_benchmark_sections_are_current():
    """``benchmarks/README.md``'s headline table and the README's summary are what
    ``python -m benchmarks.readme`` renders from ``benchmarks/headline.json``."""
    for name, body in readme.render(readme.load()).items():
        path, start, end = readme.SECTIONS[name]
        got = readme.section(path.read_text(encoding="utf-8"), start, end)
        assert got == body, (f"{path.relative_to(ROOT)} is not current: run "
                             "`python -m benchmarks.readme`")


def test_headline_results_say_where_they_come_from():
    data = readme.load()
    assert data["benchmarks"]
    for bench in data["benchmarks"]:
        assert (ROOT / "benchmarks" / f"{bench['name']}.py").exists(), bench["name"]
        assert any(r.get("summary") for r in bench["results"]), bench["name"]
        for r in bench["results"]:
            assert r["command"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), r
            assert readme.status(r) in ("", "met", "missed", "met in some runs"), r


def test_target_status_is_worked_out_from_the_numbers():
    assert readme.status({"value": 0.1, "target": 0.3}) == "met"
    assert readme.status({"value": [0.2, 0.4], "target": 0.3}) == "met in some runs"
    assert readme.status({"value": 5, "target": 4, "higher_is_better": True}) == "met"
    assert readme.status({"value": 2.4, "target": 4, "higher_is_better": True}) == "missed"
    assert readme.value_text({"value": [0.96, 0.98], "unit": "x"}) == "0.96-0.98x"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, (f"README.md has {lines} lines; move details into docs/ "
                                   f"(at most {README_LINES})")


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def test_relative_links_resolve():
    broken = []
    for md in _markdown_files():
        text = md.read_text(encoding="utf-8")
        text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # code blocks hold no links
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the same page
            path = (md.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_docs_pages_are_linked_from_the_index():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in (ROOT / "docs").glob("*.md")
               if p.name != "README.md" and f"({p.name})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"


def test_no_file_cites_a_design_document_outside_the_repository():
    """The design lives in ``docs/``; no design file outside the repository is cited."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    word = "DESIGN" + ".md"  # written apart, so that this file does not cite it
    assert not (ROOT / word).exists()
    citing = [f for f in files if (ROOT / f).is_file() and f.endswith((".py", ".md", ".toml",
                                                                      ".cfg", ".sh", ".ipynb"))
              and word in (ROOT / f).read_text(encoding="utf-8", errors="replace")]
    assert not citing, f"{', '.join(citing)} cite {word}, which is not in the repository"
