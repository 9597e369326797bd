"""The docstring examples of the public functions run and print what they claim; scripts/README.md indexes every
script there is."""

import doctest
import pathlib
import re

import pytest

import flashdecode.api
import flashdecode.append
import flashdecode.cache
import flashdecode.merge
import flashdecode.plan


MODULES = [flashdecode.api, flashdecode.plan, flashdecode.merge, flashdecode.append, flashdecode.cache]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module.__name__} has no examples"
    assert result.failed == 0


def test_scripts_index_lists_every_script_once():
    scripts = pathlib.Path(__file__).resolve().parent.parent / "scripts"
    on_disk = sorted(p.name for p in scripts.iterdir() if p.suffix in (".py", ".sh"))
    listed = re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", (scripts / "README.md").read_text(), flags=re.M)
    assert sorted(listed) == on_disk, (set(on_disk) ^ set(listed), [n for n in listed if listed.count(n) > 1])
