"""The lineage page: `lineage.load_graph()` laid out left to right and drawn as server-side SVG.

The layout is grandalf's Sugiyama layered layout (layers, crossing reduction, coordinates), not
ours. It is computed once per graph shape and cached (the shape changes only when `sync_dags`
runs or an alias resolves to a new asset); the live parts of the page (last runs, last events,
waiting events) are read on every request.
"""

import hashlib
from collections.abc import Iterable

from django.contrib import messages
from django.contrib.admin.utils import quote
from django.core.cache import cache
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from grandalf.graphs import Edge as GEdge
from grandalf.graphs import Vertex, graph_core
from grandalf.layouts import SugiyamaLayout

from ..catalog import lineage
from .base import NEUTRAL_COLOUR, relative, state_colour

NODE_WIDTH = 190
NODE_HEIGHT = 40
LAYER_GAP = 70  # between columns (the layers)
ROW_GAP = 14  # between nodes of one column
COMPONENT_GAP = 40
MAX_ROW_WIDTH = 1300  # components are packed into rows of about this width
DEFAULT_DEPTH = 2
LAYOUT_CACHE_SECONDS = 24 * 3600


class _Box:
    """grandalf's vertex view: laid out top-down with w/h swapped, then turned left-right."""

    def __init__(self, width: float, height: float):
        self.w, self.h = height, width
        self.xy = (0.0, 0.0)


class _Path:
    def __init__(self):
        self.points: list[tuple[float, float]] = []

    def setpath(self, points):
        self.points = list(points)


def _layout_component(
    component, node_width: float, node_height: float
) -> tuple[dict[str, tuple[float, float]], dict, float, float]:
    sugiyama = SugiyamaLayout(component)
    sugiyama.xspace = ROW_GAP
    sugiyama.yspace = LAYER_GAP
    sugiyama.init_all()
    sugiyama.draw(1)
    # grandalf layers top-down (y grows per layer): turn it so layers run left to right.
    positions = {v.data: (v.view.xy[1], v.view.xy[0]) for v in component.sV}
    paths = {
        (e.v[0].data, e.v[1].data): [(y, x) for x, y in e.view.points]
        for e in component.sE
        if getattr(e.view, "points", None)
    }
    xs = [x for x, _ in positions.values()]
    ys = [y for _, y in positions.values()]
    left, top = min(xs) - node_width / 2, min(ys) - node_height / 2
    positions = {k: (x - left, y - top) for k, (x, y) in positions.items()}
    paths = {k: [(x - left, y - top) for x, y in pts] for k, pts in paths.items()}
    return positions, paths, max(xs) - min(xs) + node_width, max(ys) - min(ys) + node_height


def layout(graph: lineage.Graph) -> dict:
    """Node centres and edge polylines for `graph`, components packed in rows. Cached by the
    graph's shape (its node keys and edges)."""
    return layered(
        graph.nodes,
        [(e.source, e.target) for e in graph.edges],
        node_width=NODE_WIDTH,
        node_height=NODE_HEIGHT,
        namespace="lineage-layout",
    )


def layered(
    nodes: Iterable[str],
    edges: Iterable[tuple[str, str]],
    *,
    node_width: float,
    node_height: float,
    namespace: str,
) -> dict:
    """grandalf's Sugiyama layout of `nodes` and `edges` (source, target), layers left to
    right, connected components packed in rows of about MAX_ROW_WIDTH: node centres, edge
    polylines, width and height. Cached under `namespace` by the shape (keys and edges)."""
    keys = sorted(nodes)
    links = sorted({(source, target) for source, target in edges if source != target})
    shape = (
        f"{node_width}x{node_height}\n"
        + "\n".join(keys)
        + "\n--\n"
        + "\n".join(f"{source} {target}" for source, target in links)
    )
    cache_key = f"{namespace}:" + hashlib.sha256(shape.encode()).hexdigest()
    cached = cache.get(cache_key)
    if cached is not None:
        return cached
    vertices = {key: Vertex(key) for key in keys}
    for vertex in vertices.values():
        vertex.view = _Box(node_width, node_height)
    # Connected components are found here (grandalf's Graph() finds them in quadratic time: 3 s
    # of a 3.6 s layout at 300 Dags), then each is laid out as one grandalf graph_core.
    root = {key: key for key in keys}

    def find(key: str) -> str:
        while root[key] != key:
            root[key] = root[root[key]]
            key = root[key]
        return key

    for source, target in links:
        root[find(source)] = find(target)
    members: dict[str, list[Vertex]] = {}
    for key in keys:
        members.setdefault(find(key), []).append(vertices[key])
    edges_of: dict[str, list[GEdge]] = {}
    for source, target in links:
        gedge = GEdge(vertices[source], vertices[target])
        gedge.view = _Path()
        edges_of.setdefault(find(source), []).append(gedge)
    components = sorted(
        (
            _layout_component(graph_core(vs, edges_of.get(r, [])), node_width, node_height)
            for r, vs in members.items()
        ),
        key=lambda c: (-c[3], -c[2]),
    )
    positions: dict[str, tuple[float, float]] = {}
    paths: dict[tuple[str, str], list[tuple[float, float]]] = {}
    x = y = row_height = width = 0.0
    for comp_positions, comp_paths, comp_width, comp_height in components:
        if x > 0 and x + comp_width > MAX_ROW_WIDTH:
            x, y, row_height = 0.0, y + row_height + COMPONENT_GAP, 0.0
        for key, (px, py) in comp_positions.items():
            positions[key] = (round(px + x, 1), round(py + y, 1))
        for key, pts in comp_paths.items():
            paths[key] = [(round(px + x, 1), round(py + y, 1)) for px, py in pts]
        x += comp_width + COMPONENT_GAP
        width = max(width, x)
        row_height = max(row_height, comp_height)
    result = {
        "positions": positions,
        "paths": paths,
        "width": round(width + 10),
        "height": round(y + row_height + 10),
    }
    cache.set(cache_key, result, LAYOUT_CACHE_SECONDS)
    return result


class _Urls:
    """Admin change-page URLs by pk, reversed once per kind (a page has hundreds of nodes)."""

    def __init__(self):
        self.prefix = {
            kind: reverse(f"admin:assets_app_{model}_change", args=["__pk__"])
            for kind, model in (("dag", "dag"), ("asset", "asset"), ("alias", "assetalias"))
        }

    def __call__(self, kind: str, pk) -> str:
        return self.prefix[kind].replace("__pk__", quote(str(pk)))


def _short(text: str, limit: int = 26) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _node_svg(node: lineage.Node, centre, *, now, focus: bool, urls: _Urls) -> str:
    if node.kind == "dag":
        if node.last_run_state:
            line2 = f"{node.last_run_state} {relative(node.last_run_at, now=now)}"
        else:
            line2 = "no runs yet"
        if node.waiting:
            line2 += f" · {node.waiting} waiting"
        if node.is_paused:
            line2 = "paused · " + line2
        colour = state_colour(node.last_run_state) if node.last_run_state else NEUTRAL_COLOUR
    elif node.kind == "asset":
        line2 = (
            f"event {relative(node.last_event_at, now=now)}" if node.last_event_at else "no events"
        )
        if node.waiting:
            line2 += f" · {node.waiting} waiting"
        colour = "#0891b2"
    else:
        line2, colour = "alias", "#7c3aed"
    x, y = round(centre[0] - NODE_WIDTH / 2, 1), round(centre[1] - NODE_HEIGHT / 2, 1)
    return format_html(
        '<a href="{}" class="aes-node aes-node-{}{}" data-key="{}" data-label="{}">'
        "<title>{} {} · {}</title>"
        '<rect x="{}" y="{}" width="{}" height="{}" rx="{}"/>'
        '<rect x="{}" y="{}" width="6" height="{}" fill="{}" class="aes-node-mark"/>'
        '<text x="{}" y="{}" class="aes-node-label">{}</text>'
        '<text x="{}" y="{}" class="aes-node-sub">{}</text></a>',
        urls(node.kind, node.pk),
        node.kind,
        " aes-node-focus" if focus else "",
        node.key,
        node.label,
        node.kind,
        node.label,
        line2,
        x,
        y,
        NODE_WIDTH,
        NODE_HEIGHT,
        4 if node.kind == "dag" else 18,
        x,
        y,
        NODE_HEIGHT,
        colour,
        x + 12,
        y + 17,
        _short(node.label),
        x + 12,
        y + 32,
        _short(line2, 32),
    )


def _path_d(points) -> str:
    (x0, y0), *rest = points
    # Leave the source at its right edge and enter the target at its left edge.
    start = (x0 + NODE_WIDTH / 2, y0)
    *middle, (xn, yn) = rest
    end = (xn - NODE_WIDTH / 2 - 4, yn)
    return "M{:.1f},{:.1f} ".format(*start) + " ".join(
        "L{:.1f},{:.1f}".format(*p) for p in [*middle, end]
    )


def _focus_key(graph: lineage.Graph, request) -> tuple[str | None, str | None]:
    """The node named by ?asset= (name) or ?dag= (dag_id), and an error text if none is."""
    asset, dag = request.GET.get("asset", "").strip(), request.GET.get("dag", "").strip()
    if dag:
        key = f"dag:{dag}"
        return (key, None) if key in graph.nodes else (None, f"no Dag {dag!r}")
    if asset:
        for key, node in graph.nodes.items():
            if node.kind == "asset" and node.label == asset:
                return key, None
        return None, f"no asset {asset!r} takes part in any link"
    return None, None


def lineage_view(request, *, admin_site, opts):
    now = timezone.now()
    graph = lineage.load_graph()
    focus, error = _focus_key(graph, request)
    try:
        depth = max(1, min(20, int(request.GET.get("depth", DEFAULT_DEPTH))))
    except ValueError:
        depth = DEFAULT_DEPTH
    if error:
        messages.warning(request, f"{error}; showing everything.")
    shown = graph.neighbourhood(focus, depth=depth) if focus else graph
    placed = layout(shown)
    urls = _Urls()
    # SVG markup is built here rather than in a template loop: hundreds of nodes and edges.
    nodes = mark_safe(
        "".join(
            _node_svg(node, placed["positions"][key], now=now, focus=key == focus, urls=urls)
            for key, node in sorted(shown.nodes.items())
        )
    )
    edges = format_html_join(
        "",
        '<path d="{}" class="aes-edge aes-edge-{}" marker-end="url(#arrow)">'
        "<title>{}</title></path>",
        (
            (
                _path_d(
                    placed["paths"].get((e.source, e.target))
                    or [placed["positions"][e.source], placed["positions"][e.target]]
                ),
                e.kind,
                ", ".join(e.tasks) if e.tasks else e.kind,
            )
            for e in shown.edges
            if e.source != e.target
        ),
    )
    context = {
        **admin_site.each_context(request),
        "opts": opts,
        "title": "Lineage",
        "nodes": nodes,
        "edges": edges,
        "width": placed["width"],
        "height": placed["height"],
        "focus": shown.nodes.get(focus) if focus else None,
        "depth": depth,
        "counts": {
            kind: sum(1 for n in shown.nodes.values() if n.kind == kind)
            for kind in ("dag", "asset", "alias")
        },
        "total_nodes": len(graph.nodes),
        "dag_names": sorted(n.label for n in graph.nodes.values() if n.kind == "dag"),
        "asset_names": sorted(n.label for n in graph.nodes.values() if n.kind == "asset"),
        "query": request.GET,
    }
    return TemplateResponse(request, "admin/assets_app/lineage.html", context)
