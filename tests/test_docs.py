"""The docstring examples of the public functions run and print what they claim."""

import doctest

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
