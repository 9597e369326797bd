"""The docstring examples of the public functions run and print what they claim; scripts/README.md indexes every
script there is; the docs' links and the section names that code and docs cite exist; the README's usage block runs."""

import doctest
import pathlib
import re

import pytest

import flashdecode.api
import flashdecode.append
import flashdecode.cache
import flashdecode.merge
import flashdecode.plan
import flashdecode.triton_read


ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = [flashdecode.api, flashdecode.plan, flashdecode.merge, flashdecode.append, flashdecode.cache,
           flashdecode.triton_read]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module.__name__} has no examples"
    assert result.failed == 0


def test_scripts_index_lists_every_script_once():
    scripts = ROOT / "scripts"
    on_disk = sorted(p.name for p in scripts.iterdir() if p.suffix in (".py", ".sh"))
    listed = re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", (scripts / "README.md").read_text(), flags=re.M)
    assert sorted(listed) == on_disk, (set(on_disk) ^ set(listed), [n for n in listed if listed.count(n) > 1])


# every text that cites a doc section or links a file: the package, scripts, tests and the markdown of the repo
CITING = [*ROOT.glob("src/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("tests/*.py"), ROOT / "README.md",
          *ROOT.glob("docs/**/*.md"), *ROOT.glob("scripts/*.md"), *ROOT.glob("examples/*")]


def _squash(text):
    """One line: a citation wrapped over comment lines reads as one name."""
    return " ".join(re.sub(r"^\s*#", " ", line) for line in text.splitlines()).split()


def test_cited_doc_sections_exist():
    # `design.md, "Merging the chunks"`: a heading, or a bold paragraph title, of docs/design.md starts with the name,
    # a whole word
    cites = set()
    for path in CITING:
        if path.is_file():
            text = " ".join(_squash(path.read_text()))
            where = str(path.relative_to(ROOT))
            cites |= {(doc, name, where) for doc, name in re.findall(r'(\w+)\.md\)?,? "([^"]+)"', text)}
    assert len(cites) > 20, cites
    missing = []
    for doc, name, where in sorted(cites):
        text = (ROOT / "docs" / f"{doc}.md").read_text()
        titles = _headings(text) + re.findall(r"\*\*([^*]+)\*\*", text)
        if not any(re.match(re.escape(name) + r"(\W|$)", " ".join(t.split())) for t in titles):
            missing.append(f"{where}: {doc}.md, {name!r}")
    assert not missing, missing


def _headings(text):
    """A markdown text's heading lines, without the `#` comments of its fenced code blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [line.lstrip("#").strip() for line in prose.splitlines() if line.startswith("#")]


def _anchors(md):
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in _headings(md.read_text())}


def test_markdown_links_resolve():
    # [text](path), [text](path#heading) and [text](#heading): the file exists, the heading is in it
    links = []
    for md in (p for p in CITING if p.suffix == ".md"):
        links += [(md, target) for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text())
                  if not re.match(r"[a-z]+:", target)]
    assert len(links) > 50 and any("#" in target for _, target in links), links
    broken = []
    for md, target in links:
        path, _, anchor = target.partition("#")
        file = md.parent / path if path else md
        if not file.exists() or (anchor and anchor not in _anchors(file)):
            broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_readme_usage_runs():
    """The README's usage block runs as written (on the CPU: device "cuda" -> "cpu", so `auto` takes torch_sdpa,
    in a fresh interpreter without TRITON_INTERPRET), and its merge of two halves of the keys equals the full call."""
    import os
    import subprocess
    import sys

    block = re.search(r"## Usage\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S).group(1)
    check = (
        "\nfull, full_lse = flashdecode.decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, "
        "backend='reference', return_lse=True)"
        "\nassert (merged.double() - full).abs().max() < 2e-2, (merged.double() - full).abs().max()"
        "\nassert torch.equal(merged_lse.isinf(), full_lse.isinf())"
        "\nfinite = full_lse.isfinite()"
        "\nassert (merged_lse[finite].double() - full_lse[finite]).abs().max() < 1e-3"
        "\nprint('ok', tuple(out.shape))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = block.replace('device="cuda"', 'device="cpu"') + check
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.stdout.strip() == "ok (4, 32, 128)", result.stderr[-2000:]
