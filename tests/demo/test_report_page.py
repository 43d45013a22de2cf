"""The report ``--report DIR`` writes: a page that opens without a network, the PNGs it shows
(and writes next to it), the same table the demo prints; and a clear failure, before any
fleet runs, where matplotlib is missing."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image

from epochsvc.demo.client import ClientResult
from epochsvc.demo.report import ROWS, cells, headline
from epochsvc.demo.report_page import INSTALL, write_report
from epochsvc.demo.scenario import FLEETS, FleetResult
from tests.demo.made import ORIGIN, call, fleet_result, replica, timeline_of


class Page(HTMLParser):
    """Every tag with its attributes, and the text of every table cell."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def two_fleets() -> list[FleetResult]:
    """A naive fleet that corrupted one session and hung a call, and a clean epoch fleet."""
    replicas = [replica("r1", -2.0, -1.0, 5.5, 6.2), replica("r2", 4.0, 5.0, None, 19.0)]
    naive = ClientResult(
        "c001",
        calls=[
            call(1, "completed", 0.1, 3.2),
            call(2, "completed", 3.3, 6.4, foreign=True),
            call(3, "hung", 6.5, 15.5),
        ],
    )
    epoch = ClientResult(
        "c001",
        calls=[call(1, "completed", 0.1, 3.2), call(2, "completed", 3.3, 6.5)],
        forwarded_at=[ORIGIN + 5.6, ORIGIN + 5.9],
    )
    return [
        fleet_result("naive", naive, replicas, timeline_of(naive, replicas, (5.0, 7.0))),
        fleet_result("epoch", epoch, replicas, timeline_of(epoch, replicas, (5.0, 7.5))),
    ]


def test_the_page_is_self_contained_and_shows_the_pngs_and_the_table(tmp_path: Path) -> None:
    fleets = two_fleets()
    failed = ["mcp-epoch fleet: 1 hung requests (want 0) <not markup>"]
    out = tmp_path / "report"
    page = write_report(out, fleets, failed, "2 clients, 2 replicas")
    assert page == out / "index.html"
    text = page.read_text(encoding="utf-8")
    parsed = Page()
    parsed.feed(text)

    # Nothing to fetch: every resource is inline, and nothing runs.
    tags = [tag for tag, _ in parsed.tags]
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    for _tag, attrs in parsed.tags:
        for name in ("src", "href", "srcset", "data"):
            value = attrs.get(name) or ""
            assert not value.startswith(("http:", "https:", "//")), (name, value)
    assert "url(" not in text and "@import" not in text

    # The PNGs: written to DIR, decodable, and the very bytes the page inlines.
    files = sorted(p.name for p in out.glob("*.png"))
    assert files == ["overview.png", "timeline-epoch.png", "timeline-naive.png"]
    inlined = [attrs["src"] or "" for tag, attrs in parsed.tags if tag == "img"]
    prefix = "data:image/png;base64,"
    assert len(inlined) == 3 and all(src.startswith(prefix) for src in inlined)
    on_disk = {(out / name).read_bytes() for name in files}
    assert {base64.b64decode(src.removeprefix(prefix)) for src in inlined} == on_disk
    for name in files:
        with Image.open(out / name) as img:
            img.load()
            assert img.format == "PNG" and img.width >= 800 and img.height >= 400

    # The table: the same cells the demo prints, header and every row.
    assert parsed.cells == [c.strip() for row in cells(fleets) for c in row]
    assert [FLEETS["naive"].title, FLEETS["epoch"].title] == parsed.cells[1:3]
    assert len(parsed.cells) == 3 * (len(ROWS) + 1)

    # The verdict and each fleet's outcome, as text (escaped, never markup).
    assert "&lt;not markup&gt;" in text and "<not markup>" not in text
    naive_line, naive_tone = headline(fleets[0])
    epoch_line, epoch_tone = headline(fleets[1])
    assert naive_tone == "bad" and "1 corrupted session, 1 hung call" in naive_line
    assert epoch_tone == "good" and "0 corrupted sessions, 0 hung calls" in epoch_line
    assert naive_line in text and epoch_line in text


def test_a_png_keeps_to_a_readme_size(tmp_path: Path) -> None:
    write_report(tmp_path, two_fleets(), [], "setup")
    overview = (tmp_path / "overview.png").read_bytes()
    assert len(overview) < 200_000
    with Image.open(io.BytesIO(overview)) as img:
        assert img.width == 1000  # 10 inches at the report's 100 dpi


def test_without_matplotlib_the_demo_says_what_to_install_before_running(
    tmp_path: Path,
) -> None:
    """matplotlib is installed here: the child process hides it from the import system, the
    only way to see this CLI where the extra is missing without a second environment."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from epochsvc.cli import main\n"
        f"sys.exit(main(['demo', '--report', {str(tmp_path / 'r')!r}, '--fleets', 'naive']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert INSTALL in proc.stderr and "matplotlib" in proc.stderr
    assert "replicas up" not in proc.stdout  # it stopped before any fleet ran
    assert not (tmp_path / "r").exists()


def test_the_cli_builds_its_parser_without_matplotlib() -> None:
    code = (
        "import sys; from epochsvc.cli import build_parser; build_parser()\n"
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
