import pytest

from slime_envs.rewards import em_with_format, exact_match, f1_score, normalize_answer


def test_normalize():
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"


def test_exact_match():
    assert exact_match("the Paris.", "paris") == 1.0
    assert exact_match("Paris France", ["Lyon", "paris france"]) == 1.0
    assert exact_match("Lyon", ["Paris"]) == 0.0
    assert exact_match(None, "x") == 0.0
    with pytest.raises(ValueError, match="no gold"):
        exact_match("x", [])


def test_f1_by_hand():
    # pred tokens [new, york, city], gold [new, york]: P = 2/3, R = 1, F1 = 0.8
    assert f1_score("New York City", "new york") == pytest.approx(0.8, abs=1e-12)
    # max over golds: gold "city" gives P = 1/3, R = 1 -> 0.5; "new york" gives 0.8
    assert f1_score("New York City", ["city", "New York"]) == pytest.approx(0.8, abs=1e-12)
    # multiplicity: pred [a1, a1] vs gold [a1]: common 1, P = 1/2, R = 1 -> 2/3
    assert f1_score("a1 a1", "a1") == pytest.approx(2 / 3, abs=1e-12)
    assert f1_score("x", "y") == 0.0 and f1_score(None, "y") == 0.0


def test_em_with_format():
    assert em_with_format("Paris", "paris", well_formed=True, format_score=0.2) == 1.0
    assert em_with_format("Lyon", "paris", well_formed=True, format_score=0.2) == 0.2
    assert em_with_format("Lyon", "paris", well_formed=False, format_score=0.2) == 0.0
