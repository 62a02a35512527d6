"""The instructor's report (report.html next to grades.csv): per lab, the counts (submitted,
graded, errors, not submitted), one figure (total score histogram and the score distribution of
each exercise, integer axes), the failure rate per test, and a table of every student with their
score per exercise, why they lost points (reports.reasons) and a link to their feedback.

One self-contained page: the figure is an inline PNG, nothing is loaded from the network (a
Content-Security-Policy says so too), and every student-provided string is escaped.
"""
from __future__ import annotations

import base64
import io
from collections import Counter, defaultdict
from pathlib import Path

from ..grading.results import SubmissionResult
from ..text import html_text
from .feedback import CSP
from .grades_csv import GRADER_ERROR, GradeRow
from .reasons import MAX_REASON

_STYLE = ("body{font-family:system-ui,sans-serif;max-width:72rem;margin:2em auto;padding:0 1rem}"
          "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 10px;text-align:left}"
          "td.num{text-align:right}.error{color:#cf222e}")
STATUSES = ("graded", "error", GRADER_ERROR, "not submitted")


def _figure_png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def lab_figure(lab: str, results: list[SubmissionResult], test_ids: list[str]):
    """Total score histogram and, per exercise, how many students got 0, some or all of its
    points (one matplotlib figure; counts and scores on integer ticks)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    max_score = max((r.max_score for r in results), default=0) or 1
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 0.9 + 0.45 * max(4, len(test_ids))))
    ax1.hist([r.score for r in results], bins=min(25, int(max_score) + 1), range=(-0.5, max_score + 0.5),
             color="#4477aa", edgecolor="white")
    ax1.set(title=f"{lab}: total score (n={len(results)})", xlabel="score", ylabel="students")
    for axis in (ax1.xaxis, ax1.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    # per exercise: students with 0, partial and full points, stacked
    groups = [("0 points", "#cc6677"), ("partial", "#ddcc77"), ("full points", "#117733")]
    counts = {name: [] for name, _ in groups}
    for grade_id in test_ids:
        outcomes = [t for r in results for t in r.tests if t.grade_id == grade_id]
        counts["0 points"].append(sum(t.score <= 0 for t in outcomes))
        counts["full points"].append(sum(t.score >= t.points > 0 for t in outcomes))
        counts["partial"].append(len(outcomes) - counts["0 points"][-1] - counts["full points"][-1])
    left = [0] * len(test_ids)
    for name, color in groups:
        ax2.barh(test_ids, counts[name], left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, counts[name])]
    ax2.set(title="score distribution per exercise", xlabel="students")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.invert_yaxis()
    ax2.legend(loc="lower right", fontsize="small")
    return fig


def _lab_section(lab: str, rows: list[GradeRow], results: list[SubmissionResult]) -> list[str]:
    statuses = Counter(r.status for r in rows)
    test_ids = list(dict.fromkeys(t.grade_id for r in results for t in r.tests))
    max_score = max((r.max_score for r in rows), default=0)
    mean = sum(r.score for r in results) / len(results) if results else 0.0
    parts = [f"<h2>{html_text(lab)}</h2>",
             f"<p>{len(rows) - statuses['not submitted']} submitted, {statuses['graded']} graded, "
             f"{statuses['error']} errors, {statuses[GRADER_ERROR]} grader errors, "
             f"{statuses['not submitted']} not submitted; mean score of the submissions {mean:.2f} / {max_score:g}</p>"]
    if results:
        import matplotlib.pyplot as plt

        fig = lab_figure(lab, results, test_ids)
        try:
            img = _figure_png(fig)
        finally:
            plt.close(fig)
        parts.append(f"<img alt='{html_text(lab)} figures' src='data:image/png;base64,{img}'>")
    parts.append("<table><tr><th>test</th><th>failure rate</th><th>most common message</th></tr>")
    for grade_id in test_ids:
        outcomes = [t for r in results for t in r.tests if t.grade_id == grade_id]
        messages = [t.message.splitlines()[0] for t in outcomes if t.message.strip()]
        rate = 100 * sum(bool(t.message) for t in outcomes) / len(outcomes)
        common = Counter(messages).most_common(1)[0][0] if messages else ""
        parts.append(f"<tr><td>{html_text(grade_id)}</td><td>{rate:.0f}%</td><td>{html_text(common, 160)}</td></tr>")
    parts.append("</table>")
    by_student = {r.student: r for r in results}
    parts.append("<table><tr><th>student</th><th>status</th><th>score</th>" +
                 "".join(f"<th>{html_text(t)}</th>" for t in test_ids) + "<th>message</th><th>feedback</th></tr>")
    for row in rows:
        tests = {t.grade_id: t for t in by_student[row.student].tests} if row.student in by_student else {}
        cells = "".join(f"<td class='num'>{tests[t].score:g}</td>" if t in tests else "<td></td>" for t in test_ids)
        link = f"<a href='{html_text(row.feedback)}'>feedback</a>" if row.feedback else ""
        css = " class='error'" if row.status in ("error", GRADER_ERROR) else ""
        parts.append(f"<tr{css}><td>{html_text(row.student, 80)}</td><td>{html_text(row.status)}</td>"
                     f"<td class='num'>{row.score:g} / {row.max_score:g}</td>{cells}"
                     f"<td>{html_text(row.message, MAX_REASON)}</td><td>{link}</td></tr>")
    parts.append("</table>")
    return parts


def write_report(rows: list[GradeRow], results: list[SubmissionResult], dest: Path) -> None:
    by_lab_rows: dict[str, list[GradeRow]] = defaultdict(list)
    for row in rows:
        by_lab_rows[row.lab].append(row)
    by_lab_results: dict[str, list[SubmissionResult]] = defaultdict(list)
    for r in results:
        by_lab_results[r.lab].append(r)
    statuses = Counter(r.status for r in rows)
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">",
             f"<title>LLM Camp grading report</title><style>{_STYLE}</style></head><body>",
             "<h1>Grading report</h1>",
             f"<p>{len({r.student for r in rows})} students; submissions: "
             f"{sum(v for k, v in statuses.items() if k != 'not submitted')} submitted, {statuses['graded']} graded, "
             f"{statuses['error']} errors, {statuses[GRADER_ERROR]} grader errors, "
             f"{statuses['not submitted']} not submitted</p>",
             "<p>Code similarity (copies of the answer key or of classmates, flagged for review, never a "
             "score): <a href='similarity.html'>similarity.html</a></p>"]
    for lab in sorted(l for l in by_lab_rows if l):
        parts += _lab_section(lab, by_lab_rows[lab], by_lab_results.get(lab, []))
    if by_lab_rows.get(""):
        parts.append("<h2>Uploads that could not be read</h2><table><tr><th>upload</th><th>reason</th></tr>")
        parts += [f"<tr class='error'><td>{html_text(r.student, 80)}</td><td>{html_text(r.message, 300)}</td></tr>"
                  for r in by_lab_rows[""]]
        parts.append("</table>")
    parts.append("</body></html>")
    dest.write_text("\n".join(parts), encoding="utf-8")
