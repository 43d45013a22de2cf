"""``mcp-epoch demo --report DIR``: the demo as one HTML page that opens without a network.

The page holds the verdict, the pictures (PNG, inlined as ``data:`` URIs; the same files are
written next to it) and the side-by-side table, whose cells come from
:func:`epochsvc.demo.report.cells` as the printed table's do. Its CSS is inline and it has no
script, so it reads the same from a laptop, a CI artifact or an air-gapped machine.

The pictures need matplotlib, an optional extra: :func:`require_plotting` says so before the
demo spends minutes running fleets, and :mod:`epochsvc.demo.pictures` is imported only here.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from epochsvc.demo.report import cells, headline, success_line
from epochsvc.demo.scenario import FleetResult

INSTALL = "pip install 'mcp-epoch[report]'"
PAGE = "index.html"


class ReportUnavailable(RuntimeError):
    """The report cannot be drawn here (its plotting library is missing)."""


def require_plotting() -> None:
    """Fail early, with what to install, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ReportUnavailable(
            f"--report draws its pictures with matplotlib, which is not installed: {INSTALL}"
        ) from exc


@dataclass(frozen=True)
class Picture:
    file: str
    caption: str
    data: bytes  # PNG

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.data).decode("ascii")


def draw(fleets: list[FleetResult]) -> list[Picture]:
    """All fleets on one axis (``overview.png``), then each fleet in detail, on one scale."""
    from epochsvc.demo import pictures
    from epochsvc.demo.timeline import per_second

    scale = pictures.scale_of([per_second(f.timeline) for f in fleets])
    out = [
        Picture(
            "overview.png",
            "Every fleet's tool calls per second through the same rolling deploy",
            pictures.png(pictures.overview(fleets)),
        )
    ]
    for f in fleets:
        figure = pictures.fleet_figure(f, scale)
        out.append(Picture(f"timeline-{f.kind}.png", headline(f)[0], pictures.png(figure)))
    return out


def write_report(out: Path, fleets: list[FleetResult], failed: list[str], setup: str) -> Path:
    """Write the PNGs and the page into ``out`` (created if needed); the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    pictures = draw(fleets)
    for pic in pictures:
        (out / pic.file).write_bytes(pic.data)
    page = out / PAGE
    page.write_text(render(fleets, failed, setup, pictures), encoding="utf-8")
    return page


_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1060px; margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { margin-top: 1.8em; font-size: 1.2em; }
.setup { color: #555; margin-top: 0; }
.verdict { padding: .6em 1em; border-radius: 4px; }
.ok { background: #e8f5ec; border-left: 4px solid #1d7a3a; }
.failed { background: #fbeaea; border-left: 4px solid #b01c1c; }
figure { margin: 1em 0 2em; } figure img { width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-weight: 600; margin-bottom: .3em; }
.bad { color: #b01c1c; } .warn { color: #a35a00; } .good { color: #1d7a3a; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; white-space: normal; }
thead th { border-bottom: 2px solid #bbb; position: sticky; top: 0; background: #fff; }
tr.sub td:first-child { padding-left: 1.8em; color: #555; }
dl { font-size: 14px; } dt { font-weight: 600; margin-top: .5em; }
"""

_LEGEND = [
    (
        "Above the zero line",
        "tool calls that ended in that second: green when the client got exactly what its "
        "server sent; orange when it completed having accepted foreign, duplicated or "
        "missing events without noticing (a corrupted session).",
    ),
    (
        "Below the zero line",
        "calls that failed (red: the client was told, it can retry) or hung (black: no "
        "answer and no error until the user gave up at the call's deadline).",
    ),
    (
        "Grey band, dashed lines",
        "the rolling deploy, and each moment an old replica was taken out of the rotation "
        "(drained, then stopped).",
    ),
    (
        "Responses / s (per-fleet pictures)",
        "resumptions the servers rejected (blue: the client must open a new session) and "
        "responses a replica forwarded to the process that owns the session (purple).",
    ),
    (
        "Replica lanes (per-fleet pictures)",
        "each replica starting, serving and retiring (draining, out of the rotation, "
        "stopping); an x marks one killed at the end of its grace period.",
    ),
]


def render(
    fleets: list[FleetResult], failed: list[str], setup: str, pictures: list[Picture]
) -> str:
    """The page, as one self-contained HTML string."""
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>mcp-epoch demo: a rolling deploy under load</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>mcp-epoch demo: a rolling deploy under load</h1>",
        f'<p class="setup">{e(setup)}</p>',
    ]
    if failed:
        items = "".join(f"<li>{e(line)}</li>" for line in failed)
        parts.append(f'<div class="verdict failed"><b>FAILED</b><ul>{items}</ul></div>')
    else:
        proved = success_line({f.kind for f in fleets})
        parts.append(f'<div class="verdict ok"><b>OK</b>: {e(proved)}</div>')
    parts.append("<ul>")
    for f in fleets:
        text, tone = headline(f)
        parts.append(f'<li class="{tone}">{e(text)}</li>')
    parts.append("</ul>")
    for n, pic in enumerate(pictures):
        if n == 1:
            parts.append("<h2>Each fleet</h2>")
        parts.append(
            f'<figure id="{e(pic.file)}"><figcaption>{e(pic.caption)}</figcaption>'
            f'<img src="{pic.data_uri()}" alt="{e(pic.caption)}"></figure>'
        )
        if n == 0:
            parts.append(_legend())
    parts.append("<h2>The figures</h2>")
    parts.append(_table(cells(fleets)))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _legend() -> str:
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in _LEGEND)
    return f"<h2>How to read the pictures</h2><dl>{items}</dl>"


def _table(rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in rows[0])
    body = []
    for row in rows[1:]:
        label = row[0]
        sub = ' class="sub"' if label.startswith(" ") else ""
        tds = "".join(f"<td>{e(c)}</td>" for c in [label.strip(), *row[1:]])
        body.append(f"<tr{sub}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
