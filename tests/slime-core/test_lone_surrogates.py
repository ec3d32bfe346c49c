"""`slime_core.lone_surrogates`: where a decoded JSON value holds half a surrogate pair, and its replacement."""

import json

from slime_core.lone_surrogates import first_lone_surrogate, replace_lone_surrogates


def test_first_lone_surrogate_names_the_path():
    value = json.loads('{"a": "ok", "b": [1, {"c": "xy\\udc00"}], "d": "\\ud800"}')
    assert first_lone_surrogate(value, "body") == "body['b'][1]['c']: '\\udc00' at character 2"
    assert first_lone_surrogate(json.loads('{"\\ud800": 1}'), "arguments") == "arguments key: '\\ud800' at character 0"
    assert first_lone_surrogate(json.loads('["\\ud83d\\ude00", 5, null]')) is None  # a whole pair is one character
    deep = json.loads("[" * 900 + '"\\ud800"' + "]" * 900)
    assert first_lone_surrogate(deep).endswith("[0]: '\\ud800' at character 0")  # no recursion limit


def test_replace_lone_surrogates_counts():
    assert replace_lone_surrogates("a\ud800b\udfff") == ("a\ufffdb\ufffd", 2)
    assert replace_lone_surrogates("😀 ok") == ("😀 ok", 0)
