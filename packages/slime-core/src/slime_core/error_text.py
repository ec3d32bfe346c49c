"""What a one-line error quotes: a value cut to a readable length, and the rank error inside DCP's collection.

Errors here name the flag, file or sample and then show the offending value; a whole prompt or engine reply in the
message buried the line that said what was wrong. `torch.distributed.checkpoint` reports a failed save or load as
a `CheckpointException`, a `BaseException` holding each rank's error with its traceback; the message to show is the
rank's error, not the collection's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["first_rank_error", "first_sentence", "int_digits", "preview", "shape_or_type", "shorten"]


def shorten(text: str, limit: int = 80) -> str:
    """`text` itself when at most `limit` characters, else its start with `"..."`, `limit` characters in all.

    Raises:
        ValueError: `limit` below 4 (no room for a character and the ellipsis).
    """
    if limit < 4:
        raise ValueError(f"shorten: limit {limit} leaves no room for text and '...' (at least 4)")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def preview(value: Any, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters (`shorten`): what an error shows of a value it refuses.

    A value whose `repr` raises `ValueError` (an int of more than 4,300 digits, Python's int-to-text limit, alone or
    inside a container: a plugin's label) is described instead, so that the error being built is not replaced by
    Python's "Exceeds the limit (4300 digits)" naming nothing.

    Example:
        `preview("x" * 100, 10) == "'xxxxx..."`; `preview(10**5000) == "<an int of 5,001 digits>"`.
    """
    try:
        text = repr(value)
    except ValueError:
        if isinstance(value, int):
            text = f"<an int of {int_digits(value):,} digits>"
        else:
            text = f"<a {type(value).__name__} holding an int past Python's int-to-text limit>"
    return shorten(text, limit)


def shape_or_type(value: Any) -> str:
    """How an error names a value that should have been a tensor: `"shape (3, 4)"` for an array, else its type name.

    Anything with a `shape` (a torch tensor, a numpy array) counts as an array; `torch` is not imported here.

    Example:
        `shape_or_type(torch.zeros(3, 4)) == "shape (3, 4)"`; `shape_or_type(0.5) == "float"`.
    """
    shape = getattr(value, "shape", None)
    return f"shape {tuple(shape)}" if shape is not None and not isinstance(value, type) else type(value).__name__


def int_digits(value: int) -> int:
    """The number of decimal digits of `value` (sign aside), without converting it to text (no int-string limit).

    Example:
        `int_digits(-10**5000) == 5001`, `int_digits(0) == 1`.
    """
    magnitude = abs(int(value))
    digits = max(1, int(magnitude.bit_length() * 0.30102999566398120))  # log10(2): a lower bound, off by at most 1
    return digits + 1 if magnitude >= 10**digits else digits


def first_sentence(error: BaseException, limit: int = 200) -> str:
    """`"Type: first sentence"` of `error`, its whitespace collapsed and the sentence cut to `limit` (`shorten`).

    torch's errors append paragraphs of advice after the first sentence, which buried the one line that names the
    file. An error without text gives its type alone.

    Example:
        `first_sentence(OSError("disk full. Try  again.")) == "OSError: disk full"`.
    """
    text = shorten(" ".join(str(error).split()).split(". ")[0], limit)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def first_rank_error(error: BaseException) -> BaseException:
    """The first rank's error inside DCP's `CheckpointException`, else `error` itself.

    Duck-typed (`error.failures`, a `{rank: (exception, traceback)}` dict) so that callers without
    `torch.distributed` need not import it. An `Exception` is preferred to a `BaseException` (a rank's
    `KeyboardInterrupt`) when both are there.

    Args:
        error: what a DCP save/load raised, or any other error.

    Returns:
        The rank's exception, or `error` when it holds none.
    """
    failures = getattr(error, "failures", None)
    if not isinstance(failures, dict):
        return error
    found = [f[0] for f in failures.values() if isinstance(f, tuple) and f and isinstance(f[0], BaseException)]
    return next((e for e in found if isinstance(e, Exception)), found[0] if found else error)
