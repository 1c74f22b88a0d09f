"""Reads the runs grid's compact rows (`run_grid`, `_CELL_TEXT`) as the page's script does,
so tests can assert each cell's state, colour, duration, try and link from the HTML."""

import html
import json
import re

TOKEN = re.compile(r"^(?:([a-zA-Z])|\((\d+)\))(\d*)(\+?)(?:~(\d+))?$")
CODES = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def cell_data(page: str) -> dict:
    found = re.search(r'<script id="grid-cell-data" type="application/json">(.*?)</script>', page)
    assert found, "no grid cell data"
    return json.loads(found.group(1))


def rows(page: str) -> dict[str, list[dict | None]]:
    """Task id -> per run (oldest first) None (no TI) or its cell: state, colour, ms (None
    before it started), unfinished, try, url (the cell's link)."""
    data = cell_data(page)
    decoded: dict[str, list[dict | None]] = {}
    for task_id, text in re.findall(r'<tr data-task="([^"]*)" data-cells="([^"]*)">', page):
        task_id = html.unescape(task_id)
        cells: list[dict | None] = []
        for i, token in enumerate(html.unescape(text).split(" ")):
            if token == "-":
                cells.append(None)
                continue
            match = TOKEN.match(token)
            assert match, token
            letter, number, ms, unfinished, tries = match.groups()
            state, colour = data["states"][int(number) if number else CODES.index(letter)]
            cells.append(
                {
                    "state": state,
                    "colour": colour,
                    "ms": int(ms) if ms else None,
                    "unfinished": unfinished == "+",
                    "try": int(tries or 1),
                    "url": data["ti_url"]
                    .replace("__run__", str(data["runs"][i][0]))
                    .replace("__task__", task_id),
                }
            )
        decoded[task_id] = cells
    return decoded
