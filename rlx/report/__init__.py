"""The visual compile report: one self-contained HTML page per graph (`rlxc report`).

See `rlx.report.html`.
"""

from rlx.report.html import build_report_data, render_report, write_report

__all__ = ["build_report_data", "render_report", "write_report"]
