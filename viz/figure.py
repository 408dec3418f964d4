"""The pieces every view shares: DOT text, turning it into SVG, and the object a notebook shows.

What this teaches:
- graphviz draws graphs from a small text language, DOT: `n0 -> n1;` is an edge, `n0 [label="ADD"]`
  a node, `subgraph cluster_0 { ... }` a box around a group. We write DOT ourselves (a few lines
  of string building) so it is easy to read, and ask the `dot` program to lay it out as SVG;
- a notebook shows an object through its `_repr_html_` method; a terminal uses `repr`. A `Figure`
  has both, and keeps its DOT source and SVG around so tests (and curious students) can read them;
- the HTML draws the SVG as an `<img>` whose source is the SVG itself (a `data:` URL), not as an
  inline `<svg>` element: a notebook its reader has not run yet is *untrusted*, and JupyterLab
  and Notebook 7 sanitize its HTML, which strips an inline `<svg>` down to the strings inside it.
  An image cannot run scripts, so the sanitizer keeps it, and the stored drawings show on first
  open (an `image/png` next to the HTML would not help: an untrusted output shows its HTML);
- when `dot` is missing we say how to install it and show a text view instead: a display hook
  must never raise, or the student sees a traceback instead of their graph.

Output is deterministic: node names come from the order of a graph walk, never from `id()`, so
the same input gives byte-identical SVG in every process (nbval compares notebooks that way).

>>> dot = DotWriter("example")
>>> dot.node("n0", "ADD")
>>> dot.edge("n0", "n1")
>>> print(dot.source())
digraph "example" {
  fontname="Helvetica";
  node [fontname="Helvetica", fontsize=11];
  edge [fontname="Helvetica", fontsize=9];
  n0 [label="ADD"];
  n0 -> n1;
}
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

# a qualitative palette (ColorBrewer Set3): one color per kernel, repeated after twelve
PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
           "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9"]

INSTALL_DOT = ("graphviz's `dot` program is not installed, so this is a text view. "
               "Install it with `apt-get install graphviz` (Debian/Ubuntu), `brew install "
               "graphviz` (macOS) or `conda install graphviz`, then run the cell again.")


def kernel_color(index: int) -> str:
    """The fill color of kernel number `index` (0-based)."""
    return PALETTE[index % len(PALETTE)]


def quote(text: str) -> str:
    """A DOT string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attributes(attrs: dict[str, str | int | float]) -> str:
    if not attrs:
        return ""
    parts = [f"{key}={quote(str(value))}" for key, value in attrs.items()]
    return " [" + ", ".join(parts) + "]"


class DotWriter:
    """Builds DOT text line by line; `cluster` opens a labelled box around some nodes."""

    def __init__(self, name: str, **graph_attrs: str | int | float):
        self.lines = [f"digraph {quote(name)} {{"]
        for key, value in graph_attrs.items():
            self.lines.append(f"  {key}={quote(str(value))};")
        self.lines.append('  fontname="Helvetica";')
        self.lines.append('  node [fontname="Helvetica", fontsize=11];')
        self.lines.append('  edge [fontname="Helvetica", fontsize=9];')
        self.depth = 1

    def node(self, name: str, label: str, **attrs: str | int | float) -> None:
        self.lines.append("  " * self.depth + name + _attributes({"label": label, **attrs}) + ";")

    def edge(self, source: str, target: str, **attrs: str | int | float) -> None:
        self.lines.append("  " * self.depth + f"{source} -> {target}{_attributes(attrs)};")

    def open_cluster(self, name: str, label: str, **attrs: str | int | float) -> None:
        self.lines.append("  " * self.depth + f"subgraph cluster_{name} {{")
        self.depth += 1
        for key, value in {"label": label, **attrs}.items():
            self.lines.append("  " * self.depth + f"{key}={quote(str(value))};")

    def close_cluster(self) -> None:
        self.depth -= 1
        self.lines.append("  " * self.depth + "}")

    def source(self) -> str:
        return "\n".join([*self.lines, "}"])


class DotUnavailable(RuntimeError):
    """The graphviz Python package or its `dot` program cannot be used here."""


def dot_to_svg(dot_source: str) -> str:
    """Lay out a DOT graph with graphviz's `dot` and return the <svg> element (no XML header)."""
    try:
        import graphviz
    except ImportError as error:
        raise DotUnavailable("the graphviz Python package is not installed "
                             "(pip install graphviz)") from error
    try:
        svg = graphviz.pipe("dot", "svg", dot_source.encode()).decode()
    except graphviz.ExecutableNotFound as error:
        raise DotUnavailable(INSTALL_DOT) from error
    except (graphviz.CalledProcessError, OSError) as error:
        raise DotUnavailable(f"graphviz failed: {error}") from error
    return svg[svg.index("<svg"):]


XML_COMMENT = re.compile(r"<!--.*?-->\n?", re.DOTALL)


def svg_image(svg: str, alt: str) -> str:
    """An <img> that draws `svg`: its source is a `data:image/svg+xml,` URL holding the SVG as
    text. Escaped is only what would end the URL or the attribute: `%` and `#` (an escape and a
    fragment in a URL; colours are `#rrggbb`), newlines (a URL parser drops them), `&` and `"`
    (HTML entities). graphviz's comments are left out, and its `&#45;` and `&gt;` written as the
    characters they stand for (both are plain text in XML), so the stored HTML reads as SVG:
    `<title>n0->n1</title>`. Byte-identical for the same SVG."""
    svg = XML_COMMENT.sub("", svg).replace("&#45;", "-").replace("&gt;", ">")
    url = svg.replace("%", "%25").replace("#", "%23").replace("\n", "%0A")
    source = url.replace("&", "&amp;").replace('"', "&quot;")
    return f'<img src="data:image/svg+xml,{source}" alt="{escape(alt)}">'


@dataclass
class Figure:
    """What a viz function returns: shown as HTML in a notebook, as text in a terminal."""

    title: str
    html: str
    text: str
    dot: str | None = None
    svg: str | None = None
    notes: list[str] = field(default_factory=list)

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def graph_figure(title: str, dot_source: str, text_view: str, legend_html: str = "") -> Figure:
    """An SVG figure with a legend, or, without `dot`, the text view and how to install it."""
    try:
        svg = dot_to_svg(dot_source)
    except DotUnavailable as error:
        body = notice(str(error)) + preformatted(text_view)
        return Figure(title, wrap(title, body + legend_html), text_view, dot_source, None)
    body = f'<div class="tinyteach-graph">{svg_image(svg, title)}</div>'
    return Figure(title, wrap(title, body + legend_html), text_view, dot_source, svg)


# ---- small HTML helpers (inline styles only: notebooks strip <style> from untrusted output)

def wrap(title: str, body: str) -> str:
    heading = f'<div style="font-weight:bold;margin:4px 0">{escape(title)}</div>'
    return f'<div class="tinyteach-view">{heading}{body}</div>'


def escape(text: str) -> str:
    return html.escape(text, quote=True)


def preformatted(text: str) -> str:
    return (f'<pre style="font-size:12px;line-height:1.3;margin:4px 0">'
            f"{escape(text)}</pre>")


def notice(text: str) -> str:
    return (f'<div class="tinyteach-notice" style="border-left:4px solid #e0a000;'
            f'padding:4px 8px;margin:4px 0;background:#fff8e0">{escape(text)}</div>')


def swatch(color: str) -> str:
    return (f'<span style="display:inline-block;width:12px;height:12px;background:{color};'
            f'border:1px solid #888;margin-right:4px;vertical-align:middle"></span>')


def table(rows: list[list[str]], header: list[str]) -> str:
    """An HTML table; cells are HTML already (escape text before passing it)."""
    style = 'style="text-align:left;padding:2px 8px;vertical-align:top"'
    head = "".join(f"<th {style}>{cell}</th>" for cell in header)
    head_row = f"<tr>{head}</tr>" if any(header) else ""
    body = "".join("<tr>" + "".join(f"<td {style}>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f'<table style="border-collapse:collapse;font-size:12px">{head_row}{body}</table>'
