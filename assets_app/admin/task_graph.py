"""The task graph of the Dag page and the run page (issue 45, Airflow's graph view): the Dag's
tasks and upstream edges (`catalog.task_graph`) laid out left to right by grandalf's layered
layout (`lineage.layered`, cached by shape), drawn as server-side SVG. Task groups are folded
into one node until opened (`?open=GROUP`, as a click on the group does); on the run page each
node is coloured by its state in that run.

A graph of more than MAX_NODES drawn nodes is not laid out (grandalf takes about 1 s at 500
nodes and 2.6 s at 1,000 on this machine, uncached): the page says so and points to the grid.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlencode

from django.contrib.admin.utils import quote
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..catalog import task_graph
from .base import NEUTRAL_COLOUR, state_colour
from .lineage import layered

NODE_WIDTH = 170
NODE_HEIGHT = 38
GROUP_PAD = 10
MAX_NODES = 500
OPEN_PARAM = "open"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _page_url(path: str, open_groups: Iterable[str]) -> str:
    query = urlencode([(OPEN_PARAM, g) for g in sorted(set(open_groups))])
    return f"{path}?{query}#task-graph" if query else f"{path}#task-graph"


def render(
    *,
    shape: task_graph.Shape,
    request,
    tis: Iterable[tuple[str, str | None, object]] | None = None,
    run_pk: int | None = None,
) -> SafeString:
    """The graph's HTML: an SVG, or a note when it has no tasks or more than MAX_NODES drawn
    nodes. `tis` (task_id, state, ti id) colour it by a run's states (the run page)."""
    wanted = request.GET.getlist(OPEN_PARAM) if request is not None else []
    folded = task_graph.fold(shape, open_groups=wanted)
    path = request.path if request is not None else ""
    if not folded.nodes:
        return mark_safe('<p class="aes-muted" id="task-graph">This Dag has no tasks.</p>')
    if len(folded.nodes) > MAX_NODES:
        return format_html(
            '<p class="aes-muted" id="task-graph">{} nodes to draw: more than the graph draws '
            "({}). {}</p>",
            len(folded.nodes),
            MAX_NODES,
            "Fold its task groups, or read the grid."
            if folded.open_groups
            else "Its tasks are listed below and on the grid.",
        )
    placed = layered(
        folded.nodes,
        folded.edges,
        node_width=NODE_WIDTH,
        node_height=NODE_HEIGHT,
        namespace="task-graph-layout",
    )
    states = task_graph.node_states(folded, tis) if tis is not None else None
    task_pks = {t.task_id: t.pk for t in shape.tasks}
    opened = set(folded.open_groups)
    ti_url = reverse("admin:assets_app_taskinstance_change", args=["__pk__"])
    task_url = reverse("admin:assets_app_task_change", args=["__pk__"])
    run_url = reverse("admin:assets_app_dagrun_change", args=[run_pk]) if run_pk else ""
    boxes = []
    for group, keys in sorted(folded.open_groups.items(), key=lambda kv: kv[0].count(".")):
        centres = [placed["positions"][k] for k in keys if k in placed["positions"]]
        if not centres:
            continue
        depth = group.count(".")
        pad = GROUP_PAD + 4 * max(0, 3 - depth)
        left = min(x for x, _ in centres) - NODE_WIDTH / 2 - pad
        top = min(y for _, y in centres) - NODE_HEIGHT / 2 - pad - 12
        right = max(x for x, _ in centres) + NODE_WIDTH / 2 + pad
        bottom = max(y for _, y in centres) + NODE_HEIGHT / 2 + pad
        boxes.append(
            format_html(
                '<g class="aes-tg-group-box" data-group="{}"><rect x="{}" y="{}" width="{}" '
                'height="{}" rx="6"/><a href="{}"><title>fold {}</title>'
                '<text x="{}" y="{}" class="aes-node-sub">▾ {}</text></a></g>',
                group,
                round(left, 1),
                round(top, 1),
                round(right - left, 1),
                round(bottom - top, 1),
                _page_url(path, {g for g in opened if not _within(g, group)}),
                group,
                round(left + 6, 1),
                round(top + 13, 1),
                folded.group_labels.get(group, group),
            )
        )
    nodes = []
    for key, node in folded.nodes.items():
        x, y = placed["positions"][key]
        x, y = round(x - NODE_WIDTH / 2, 1), round(y - NODE_HEIGHT / 2, 1)
        state = states.get(key) if states is not None else None
        label = node.label + (" [ ]" if node.mapped and not state else "")
        if node.kind == "group":
            href = _page_url(path, opened | {node.node_id})
            sub = f"{len(node.members)} tasks · ▸ open"
        elif states is not None:
            href = (
                ti_url.replace("__pk__", state.ti_id)
                if state and state.ti_id
                else f"{run_url}#run-task-instances"
            )
            sub = ""
        else:
            pk = task_pks.get(node.node_id)
            href = task_url.replace("__pk__", quote(str(pk))) if pk is not None else ""
            sub = "" if node.trigger_rule == "all_success" else node.trigger_rule
        if node.is_setup:
            sub = "setup" + (f" · {sub}" if sub else "")
        if node.is_teardown:
            sub = "teardown" + (f" · {sub}" if sub else "")
        if states is not None:
            if state is None:
                words = "no task instance"
            elif state.count > 1 or node.mapped or node.kind == "group":
                words = ", ".join(f"{n} {s}" for s, n in state.counts)
                label = node.label + (f" [{state.count}]" if node.mapped else "")
            else:
                words = state.state or "no status"
            sub = f"{words} · {sub}" if sub and node.kind != "group" else words
        colour = state_colour(state.state) if state is not None else NEUTRAL_COLOUR
        nodes.append(
            format_html(
                '<a href="{}" class="aes-node aes-tg-node aes-tg-{}" data-key="{}" '
                'data-state="{}"><title>{}{}</title>'
                '<rect x="{}" y="{}" width="{}" height="{}" rx="{}"/>'
                '<rect x="{}" y="{}" width="6" height="{}" fill="{}" class="aes-node-mark"/>'
                '<text x="{}" y="{}" class="aes-node-label">{}</text>'
                '<text x="{}" y="{}" class="aes-node-sub">{}</text></a>',
                href,
                node.kind,
                node.node_id,
                (state.state or "") if state is not None else "",
                node.node_id,
                f" · {sub}" if sub else "",
                x,
                y,
                NODE_WIDTH,
                NODE_HEIGHT,
                8 if node.kind == "group" else 4,
                x,
                y,
                NODE_HEIGHT,
                colour,
                x + 12,
                y + 16,
                _short(label, 23),
                x + 12,
                y + 30,
                _short(sub, 30),
            )
        )
    edges = format_html_join(
        "",
        '<path d="{}" class="aes-edge" marker-end="url(#tg-arrow)"><title>{} → {}</title></path>',
        (
            (
                _path_d(
                    placed["paths"].get((source, target))
                    or [placed["positions"][source], placed["positions"][target]]
                ),
                folded.nodes[source].node_id,
                folded.nodes[target].node_id,
            )
            for source, target in folded.edges
        ),
    )
    # Room around the layout for the open groups' boxes and their labels (nested ones grow).
    margin = 6 + (max((g.count(".") + 1 for g in opened), default=0)) * (GROUP_PAD + 20)
    return mark_safe(
        render_to_string(
            "admin/assets_app/task_graph.html",
            {
                "margin": -margin,
                "width": placed["width"] + 2 * margin,
                "height": placed["height"] + 2 * margin,
                "boxes": mark_safe("".join(boxes)),
                "nodes": mark_safe("".join(nodes)),
                "edges": edges,
                "opened": sorted(opened),
                "fold_all": _page_url(path, ()),
                "groups": sum(1 for n in folded.nodes.values() if n.kind == "group"),
            },
        )
    )


def _within(group: str, outer: str) -> bool:
    return group == outer or group.startswith(f"{outer}.")


def _path_d(points) -> str:
    (x0, y0), *rest = points
    start = (x0 + NODE_WIDTH / 2, y0)
    *middle, (xn, yn) = rest
    end = (xn - NODE_WIDTH / 2 - 4, yn)
    return "M{:.1f},{:.1f} ".format(*start) + " ".join(
        "L{:.1f},{:.1f}".format(*p) for p in [*middle, end]
    )
