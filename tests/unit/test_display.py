"""The text the ``asyncq`` command prints: tables, and what a listing cut short says."""

from __future__ import annotations

from asyncq import display


def test_a_table_has_lower_case_headers_and_numbers_to_the_right() -> None:
    rows = [[7, "mail.send", "12:00"], [12, "x", None]]
    assert display.table(["ID", "Task", "Next slot"], rows).splitlines() == [
        "id  task       next slot",
        " 7  mail.send  12:00",
        "12  x          -",
    ]


def test_a_listing_cut_short_says_how_much_it_shows() -> None:
    assert display.shown(20, 57) == "20 of 57 shown"
    assert display.shown(20, 1000, more=True) == "20 of 1,000+ shown"
    assert display.shown(2500, 12345) == "2,500 of 12,345 shown"
