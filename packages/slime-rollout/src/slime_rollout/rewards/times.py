"""Times of day as final answers: `5:30 PM` and `17:30` name the same minute (`math_utils.grade_fast`)."""

from __future__ import annotations

from slime_rollout.rewards.normalize import CleanAnswer

__all__ = ["same_time"]


def same_time(p: CleanAnswer, g: CleanAnswer) -> bool:
    """Whether two times of day (`clean_answer` texts `h:mm`, AM/PM in `meridiem`) are the same time.

    A time with AM/PM, or a 24-hour one (hour 0 or 13-23), names one minute of the day: two such are compared as
    that minute (`5:30 PM` = `17:30`, `12:15 AM` = `0:15`; `5:30 AM` ≠ `17:30`). Otherwise they are compared as
    written, AM/PM on one side only dropped like a unit (`5:30 PM` = `5:30`; `5:30` ≠ `17:30`).
    """
    minutes = [_minute_of_day(c) for c in (p, g)]
    if None not in minutes:
        return minutes[0] == minutes[1]
    return p.text == g.text


def _minute_of_day(clean: CleanAnswer) -> int | None:
    """The minute since midnight that a time names, or None when it could be AM or PM (`5:30`, `12:00`)."""
    hour, minute = (int(n) for n in clean.text.split(":"))
    if minute > 59 or (clean.meridiem and not 1 <= hour <= 12):
        return None  # not a time of day (`5:75 PM`, `13:00 PM`): compared as written
    if clean.meridiem:
        return ((hour % 12) + (12 if clean.meridiem == "pm" else 0)) * 60 + minute
    return hour * 60 + minute if hour == 0 or 13 <= hour <= 23 else None
