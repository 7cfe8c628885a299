"""The shared chart code inlined into a page of ours (the HTML report, the sweep, what-if and iobench
plots): uPlot, the palette, ``assets/charts.js`` and the page's data, all inline, nothing from the
network. A page puts ``<div data-chart=...>`` elements in its body and a script that draws them from
``window.HOLOPROF_REPORT`` with ``window.HoloViews``.
"""

from __future__ import annotations

from typing import Any

from holoprof.present import palette

#: A page's policy: nothing from the network, only the inline styles and scripts of the page.
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def csp_meta() -> str:
    return f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'


def styles() -> str:
    """uPlot's stylesheet and the views' (the dashboard's look of charts, legends, badges)."""
    return palette.asset("vendor/uPlot.min.css") + palette.asset("views.css")


def scripts(data: Any, draw_js: str) -> str:
    """uPlot, the palette, the shared view code, ``data`` as ``window.HOLOPROF_REPORT`` and
    ``draw_js`` (the page's own drawing), each an inline script."""
    return "".join(
        f"<script>{text}</script>"
        for text in (
            palette.asset("vendor/uPlot.iife.min.js"),
            palette.palette_js(),
            palette.asset("charts.js"),
            f"window.HOLOPROF_REPORT = {palette.script_json(data)};",
            draw_js,
        )
    )
