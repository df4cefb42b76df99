"""``change_case:english_capital`` / ``english_lowercase`` as the IFEval reference checks them: the case, and
``langdetect`` calling the response English (text it cannot classify counts as following)."""

from __future__ import annotations

import pytest

from acl_lib.envs.ifeval_checks import check_instruction, check_instruction_loose

CAPITAL, LOWER = "change_case:english_capital", "change_case:english_lowercase"


@pytest.mark.parametrize("iid, response, follows", [
    # in capitals and detected as English: follows
    (CAPITAL, "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG. IT WAS A SUNNY DAY IN THE PARK.", True),
    # in capitals but detected as another language: does not follow. The reference misfires here: a bare
    # "YES" is detected as Welsh, "ALL CAPS, 123!" as Catalan
    (CAPITAL, "YES", False),
    (CAPITAL, "ALL CAPS, 123!", False),
    # lower case, English: follows; lower case, Spanish: does not
    (LOWER, "the cat sleeps on the table all afternoon because it is warm.", True),
    (LOWER, "el gato duerme en la mesa toda la tarde porque hace calor y no quiere salir.", False),
    # the case is checked first: English not in capitals does not follow
    (CAPITAL, "The quick brown fox jumps over the lazy dog.", False),
    (LOWER, "The quick brown fox jumps over the lazy dog.", False),
])
def test_change_case_follows_the_reference(iid, response, follows):
    assert check_instruction(iid, {}, response) is follows


def test_the_language_test_is_deterministic():
    text = "OK THEN WE GO"
    first = check_instruction(CAPITAL, {}, text)
    assert all(check_instruction(CAPITAL, {}, text) == first for _ in range(5))


def test_loose_check_applies_the_language_test_too():
    assert not check_instruction_loose(LOWER, {}, "**el gato duerme en la mesa toda la tarde porque hace calor.**")
    assert check_instruction_loose(LOWER, {}, "**the cat sleeps on the table all afternoon because it is warm.**")
