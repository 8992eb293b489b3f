"""minite.cli: every verb's parser builds and prints its help (an option defined twice, or a bad
default, breaks a verb for every caller before it does anything), and an unknown verb is named."""

from __future__ import annotations

import pytest

from minite.cli import VERBS, main


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_prints_its_help(verb, capsys):
    try:
        code = main([verb, "--help"])
    except SystemExit as e:  # argparse's --help
        code = e.code
    assert code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "--help" in out


def test_unknown_verb_says_the_closest(capsys):
    assert main(["evl"]) == 2
    assert "did you mean 'eval'" in capsys.readouterr().err
