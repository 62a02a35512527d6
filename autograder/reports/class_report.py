"""The instructor's report: score distribution per lab and failure rate per test, as
matplotlib figures in one self-contained HTML page (report.html next to grades.csv)."""
from __future__ import annotations

import base64
import io
from collections import defaultdict
from html import escape
from pathlib import Path

from ..grading.results import SubmissionResult


def _figure_png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def write_report(results: list[SubmissionResult], dest: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_lab: dict[str, list[SubmissionResult]] = defaultdict(list)
    for r in results:
        by_lab[r.lab].append(r)
    parts = ["<!doctype html><meta charset='utf-8'><title>LLM Camp grading report</title>",
             "<style>body{font-family:sans-serif;max-width:980px;margin:2em auto}td,th{padding:2px 10px}</style>",
             "<h1>Grading report</h1>"]
    for lab, rows in sorted(by_lab.items()):
        graded = [r for r in rows if r.status == "graded"]
        max_score = max((r.max_score for r in rows), default=0)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
        ax1.hist([r.score for r in rows], bins=min(20, max(5, int(max_score) + 1)), range=(0, max_score or 1),
                 color="#4477aa", edgecolor="white")
        ax1.set(title=f"{lab}: score distribution (n={len(rows)})", xlabel="score", ylabel="students")
        tests: dict[str, list[bool]] = defaultdict(list)
        for r in rows:
            for t in r.tests:
                tests[t.grade_id].append(bool(t.message))
        names = list(tests)
        rates = [100 * sum(v) / len(v) for v in tests.values()]
        ax2.barh(names, rates, color="#cc6677")
        ax2.set(title="failure rate per test", xlabel="% of submissions failing", xlim=(0, 100))
        ax2.invert_yaxis()
        img = _figure_png(fig)
        plt.close(fig)
        mean = sum(r.score for r in rows) / len(rows)
        parts += [f"<h2>{escape(lab)}</h2>",
                  f"<p>{len(rows)} submissions, {len(graded)} graded, {len(rows) - len(graded)} not gradable; "
                  f"mean score {mean:.2f} / {max_score:g}</p>",
                  f"<img alt='{escape(lab)} figures' src='data:image/png;base64,{img}'>",
                  "<table><tr><th>test</th><th>failure rate</th><th>most common message</th></tr>"]
        for name, rate in zip(names, rates):
            messages = [t.message.splitlines()[0] for r in rows for t in r.tests if t.grade_id == name and t.message]
            common = max(set(messages), key=messages.count) if messages else ""
            parts.append(f"<tr><td>{escape(name)}</td><td>{rate:.0f}%</td><td>{escape(common[:160])}</td></tr>")
        parts.append("</table>")
    dest.write_text("\n".join(parts))
