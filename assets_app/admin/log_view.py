"""Task logs as an Airflow user reads them (issue 45): one line per record (`[time] LEVEL -
message key=value`), the context keys the TI page shows already left out, an exception's
`error_detail` as a Python traceback, `::group::` / `::endgroup::` folded, ANSI colours as
spans. Everything a worker shipped is escaped: a `<script>` in a log line stays text.

The line format follows Airflow 3.3.2's log view (its UI's text rendering): `logger` is shown
as `source`, `filename` and `lineno` as `loc=file:line`, and `ti_id`, `dag_id`, `task_id`,
`run_id`, `try_number`, `map_index` are dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

CONTEXT_KEYS = frozenset(("ti_id", "dag_id", "task_id", "run_id", "try_number", "map_index"))
GROUP_START = "::group::"
GROUP_END = "::endgroup::"

# CSI sequences: SGR (`...m`) is drawn; any other (cursor moves, erase) is dropped.
_CSI = re.compile(r"\x1b\[([0-9;]*)([@-~])")
_OTHER_ESCAPES = re.compile(r"\x1b[@-Z\\-_]|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")
# The 16 colours of xterm's default palette.
_PALETTE = (
    "#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
    "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff",
)  # fmt: skip


def record_line(message: dict) -> str:
    """One structured record as Airflow's log view prints it, as plain text."""
    rest = {k: v for k, v in message.items() if k not in ("timestamp", "level", "event")}
    rest.pop("error_detail", None)
    if "filename" in rest and "lineno" in rest:
        rest["loc"] = f"{rest.pop('filename')}:{rest.pop('lineno')}"
    parts = []
    if message.get("timestamp"):
        parts.append(f"[{message['timestamp']}] ")
    if isinstance(message.get("level"), str):
        parts.append(f"{message['level'].upper()} - ")
    event = message.get("event")
    parts.append(event if isinstance(event, str) else json.dumps(event, default=str))
    for key, value in rest.items():
        if key in CONTEXT_KEYS:
            continue
        shown = json.dumps(value, default=str) if isinstance(value, dict | list) else value
        parts.append(f" {'source' if key == 'logger' else key}={shown}")
    return "".join(parts)


def traceback_text(error_detail) -> str:
    """structlog's `ExceptionDictTransformer` output (the SDK's `error_detail`: the raised
    exception first, then its cause or context) as Python prints it: the innermost first,
    each `Traceback (most recent call last):`, its frames, `Type: value`."""
    if not isinstance(error_detail, list):
        return json.dumps(error_detail, default=str)
    stacks = [s for s in error_detail if isinstance(s, dict)]
    blocks = []
    for i in range(len(stacks) - 1, -1, -1):
        stack = stacks[i]
        lines = []
        if stack.get("frames"):
            lines.append("Traceback (most recent call last):")
        for frame in stack.get("frames") or ():
            if isinstance(frame, dict):
                lines.append(
                    f'  File "{frame.get("filename")}", line {frame.get("lineno")}, '
                    f"in {frame.get('name')}"
                )
        value = stack.get("exc_value")
        lines.append(f"{stack.get('exc_type')}: {value}" if value else str(stack.get("exc_type")))
        lines += [str(note) for note in stack.get("exc_notes") or ()]
        blocks.append("\n".join(lines))
        if i > 0:
            blocks.append(
                "The above exception was the direct cause of the following exception:"
                if stack.get("is_cause")
                else "During handling of the above exception, another exception occurred:"
            )
    return "\n\n".join(blocks)


def _sgr_style(codes: list[int], style: dict[str, str]) -> None:
    i = 0
    while i < len(codes):
        code = codes[i]
        if code == 0:
            style.clear()
        elif code == 1:
            style["font-weight"] = "bold"
        elif code == 2:
            style["opacity"] = "0.7"
        elif code == 3:
            style["font-style"] = "italic"
        elif code == 4:
            style["text-decoration"] = "underline"
        elif code == 22:
            style.pop("font-weight", None)
            style.pop("opacity", None)
        elif code == 23:
            style.pop("font-style", None)
        elif code == 24:
            style.pop("text-decoration", None)
        elif 30 <= code <= 37 or 90 <= code <= 97:
            style["color"] = _PALETTE[code - 30 if code < 90 else code - 82]
        elif 40 <= code <= 47 or 100 <= code <= 107:
            style["background"] = _PALETTE[code - 40 if code < 100 else code - 92]
        elif code == 39:
            style.pop("color", None)
        elif code == 49:
            style.pop("background", None)
        elif code in (38, 48):
            prop = "color" if code == 38 else "background"
            if codes[i + 1 : i + 2] == [5] and i + 2 < len(codes):
                style[prop] = _colour_256(codes[i + 2])
                i += 2
            elif codes[i + 1 : i + 2] == [2] and i + 4 < len(codes):
                r, g, b = (min(c, 255) for c in codes[i + 2 : i + 5])
                style[prop] = f"rgb({r},{g},{b})"
                i += 4
        i += 1


def _colour_256(n: int) -> str:
    n = min(max(n, 0), 255)
    if n < 16:
        return _PALETTE[n]
    if n >= 232:
        level = 8 + (n - 232) * 10
        return f"rgb({level},{level},{level})"
    n -= 16
    r, g, b = (n // 36, (n // 6) % 6, n % 6)
    return "rgb({},{},{})".format(*(0 if c == 0 else 55 + c * 40 for c in (r, g, b)))


def ansi_html(text: str) -> SafeString:
    """`text` HTML-escaped, its SGR colour codes as `<span style=...>`; other escape
    sequences dropped. The styles come from our own table and integers only."""
    out: list[str] = []
    style: dict[str, str] = {}
    open_span = False
    pos = 0
    for match in _CSI.finditer(text):
        out.append(escape(_OTHER_ESCAPES.sub("", text[pos : match.start()])))
        pos = match.end()
        if match.group(2) != "m":
            continue
        codes = [int(c) if c else 0 for c in match.group(1).split(";")]
        _sgr_style(codes, style)
        if open_span:
            out.append("</span>")
            open_span = False
        if style:
            css = ";".join(f"{k}:{v}" for k, v in style.items())
            out.append(f'<span class="aes-ansi" style="{css}">')
            open_span = True
    out.append(escape(_OTHER_ESCAPES.sub("", text[pos:])))
    if open_span:
        out.append("</span>")
    return mark_safe("".join(out))


def render(messages: Iterable[dict]) -> SafeString:
    """The records as HTML lines inside `<pre>`-like blocks: groups folded as
    `<details><summary>`, a record's exception as a traceback under its line."""
    out: list[str] = []
    depth = 0
    for message in messages:
        event = message.get("event")
        if isinstance(event, str) and event.lstrip().startswith(GROUP_START):
            title = event.lstrip()[len(GROUP_START) :].strip()
            out.append(f'<details class="aes-log-group"><summary>{ansi_html(title)}</summary>')
            depth += 1
            continue
        if isinstance(event, str) and event.strip() == GROUP_END:
            if depth:
                out.append("</details>")
                depth -= 1
            continue
        level = str(message.get("level") or "").lower()
        css = f"aes-log-line aes-log-{level}" if level.isalpha() else "aes-log-line"
        out.append(f'<div class="{css}">{ansi_html(record_line(message))}</div>')
        if message.get("error_detail") is not None:
            out.append(
                f'<div class="aes-log-traceback">'
                f"{escape(traceback_text(message['error_detail']))}</div>"
            )
    out.append("</details>" * depth)
    return mark_safe("".join(out))
