"""Code similarity (similarity.html and similarity.csv next to grades.csv): each submission's own
code compared with the course's answer key and with every classmate's, matches shown to the
instructor with the lines side by side. A flag asks a person to look; it never changes a score.

The comparison is copydetect's (PyPI), the winnowing fingerprints MOSS uses: code is tokenized
(pygments), names and strings become placeholders, so renaming variables, reformatting, comments
and docstrings hide nothing; a match is a run of at least `NOISE` placeholder characters.
- A submission's code: the cells it runs that are not the course's (autograder.grading.program,
  the locked, parameters and setup cells left out) and its .py files (the ones the static scan
  reads), each document capped at `MAX_CHARS`.
- The answer key: the lab's solution cells (solutions/) and the camplib modules the lab forbids
  or whose text names them (b01: camplib/attention.py; b02: camplib/rope.py as well).
- What everyone shares is not evidence: the lines of the released exercise cells (signatures,
  docstrings, given lines) and of the code its text shows are blanked in every document (`blank_template`), and every fingerprint
  of the released notebook's code (the visible tests too) is boilerplate, removed before
  comparing; a template left blank or kept as given matches nothing.
A pair is flagged when at least `THRESHOLD` of one side's fingerprinted code (the submission's
side, against the answer key) is found in the other and the match covers at least `MIN_OVERLAP`
characters. A submission that cannot be read is listed, not compared; nothing here can stop
grading (grade.py catches any failure and says so in similarity.html).
"""
from __future__ import annotations

import bisect
import csv
import hashlib
import io
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..catalog import GradingCaps, Lab
from ..course.labspec import LabSpec
from ..course.nbgrader_setup import submission_folder
from ..grading.program import build_program
from ..grading.static_check import course_sources, submission_files
from ..grading.uploads import read_notebook
from ..grading.uploads.files import read_bounded
from ..text import html_text, write_inert_csv
from .feedback import CSP

NOISE = 25             # shortest match counted, in tokenized characters (copydetect's default)
THRESHOLD = 0.5        # share of one side's fingerprinted code found in the other
MIN_OVERLAP = 150      # tokenized characters a flagged match covers at least (about 8 lines of code)
MAX_CHARS = 100_000    # of one document's code: a huge upload is compared on its first part
MAX_REFERENCE_FILES = 40
MAX_SHOWN = 60        # flagged pairs of a lab shown side by side (all are listed)
BUDGET_SECONDS = 600   # for the whole report: comparisons left when it is spent are listed as skipped
_VOTERS = 8           # places a repeated fingerprint is followed at when lining blocks up
_CAMPLIB = re.compile(r"\bcamplib(?:\.\w+)+")
_FENCED = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
_STYLE = ("body{font-family:system-ui,sans-serif;max-width:90rem;margin:2em auto;padding:0 1rem}"
          "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
          "text-align:left;vertical-align:top}td.num{text-align:right}"
          "pre{margin:0;white-space:pre-wrap;font-size:85%;max-width:44rem}.note{color:#555}")


@dataclass
class Document:
    """One side of a comparison: the text compared and where each of its lines came from."""
    owner: str                      # a student id, or a reference file ("solutions/b01_attention.ipynb")
    parts: list[tuple[str, str]]    # (origin: "cell 6 (softmax)", "helper.py", ...; its code)
    reference: bool = False
    note: str = ""
    text: str = field(init=False)
    origins: list[tuple[int, str]] = field(init=False)   # (first line of a part, its origin), 1-based
    compared: str = field(default="", init=False, repr=False)   # the text fingerprinted: blank_template
    line_map: np.ndarray | None = field(default=None, init=False, repr=False)   # see _line_map

    def __post_init__(self):
        chunks, self.origins, line = [], [], 1
        for origin, code in self.parts:
            code = code if code.endswith("\n") else code + "\n"
            chunks.append(code)
            self.origins.append((line, origin))
            line += code.count("\n")
        self.text = "".join(chunks)
        if len(self.text) > MAX_CHARS:
            self.text = self.text[:MAX_CHARS]
            self.note = f"only its first {MAX_CHARS} characters were compared"

    def part(self, line: int) -> int:
        """Index of the part holding document line `line` (1-based)."""
        return max(0, bisect.bisect_right(self.origins, (line, "\U0010ffff")) - 1)

    def last_line(self, line: int) -> int:
        """The last line of the part holding document line `line`."""
        p = self.part(line)
        return self.origins[p + 1][0] - 1 if p + 1 < len(self.origins) else self.text.count("\n")

    def trim(self, first: int, last: int) -> tuple[int, int]:
        """Lines first..last without the blank (or blanked: template) lines at either end."""
        lines = self.compared.split("\n")
        while first < last and not lines[first - 1].strip():
            first += 1
        while last > first and not lines[last - 1].strip():
            last -= 1
        return first, last

    def where(self, first: int, last: int) -> str:
        """"cell 6 (softmax), lines 3-9" for document lines first..last (1-based)."""
        (p, q) = self.part(first), self.part(last)
        a, b = first - self.origins[p][0] + 1, last - self.origins[q][0] + 1
        if p != q:
            return f"{self.origins[p][1]}, line {a} to {self.origins[q][1]}, line {b}"
        return f"{self.origins[p][1]}, line{'s' if b > a else ''} {a}{f'-{b}' if b > a else ''}"


@dataclass
class Match:
    lab: str
    student: str
    other: str
    kind: str                  # "reference" | "classmate"
    similarity: float          # share of the student's fingerprinted code found in `other`
    other_similarity: float    # and the other way round
    overlap: int               # tokenized characters matched
    blocks: list[tuple[str, str, str, str]]   # (student's place, their lines, other's place, its lines)


@dataclass
class LabReport:
    lab: Lab
    compared: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    matches: list[Match] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- documents ----------------------------------------------------------------------------------

def student_document(student: str, folder: Path, spec: LabSpec, caps: GradingCaps) -> Document:
    """The code a submission brings: its non-course cells, in the order they run, and its .py files."""
    nb = read_notebook(folder / spec.notebook, caps)
    course = course_sources(spec)
    parts = [(label, source) for label, source, _ in build_program(spec, nb).cells if source not in course]
    total = sum(len(s) for _, s in parts)
    for path in submission_files(folder, Path(spec.folder) if spec.folder else None)[0]:
        if total > MAX_CHARS:
            break
        code = read_bounded(path, caps.notebook_bytes).decode("utf-8", "replace")
        parts.append((str(path.relative_to(folder)), code))
        total += len(code)
    return Document(student, parts)


def template_document(spec: LabSpec, release: Path) -> list[str]:
    """The released notebook's code: as a blank submission's document followed by the code shown
    in its text (```-fenced), then cell by cell."""
    import nbformat

    nb = nbformat.read(release, as_version=4)
    course = course_sources(spec)
    blank = Document("template", [(label, s) for label, s, _ in build_program(spec, nb).cells if s not in course])
    shown = [code for c in nb.cells if c.cell_type == "markdown" for code in _FENCED.findall(c.source)]
    return ["".join([blank.text, *shown])] + [c.source for c in nb.cells if c.cell_type == "code"] + shown


def reference_documents(lab: Lab, root: Path) -> list[Document]:
    """The answer key: the lab's solution cells, and the camplib modules it forbids or names."""
    import nbformat

    nb = nbformat.read(lab.source_path(root), as_version=4)
    solution = [(f"cell {i} ({c.metadata['nbgrader'].get('grade_id', '')})", c.source)
                for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]
    docs = [Document(f"solutions/{lab.name}/{lab.notebook}", solution, reference=True)] if solution else []
    names = [n for n in lab.forbid if n.startswith("camplib.")]
    names += [n for c in nb.cells if c.cell_type == "markdown" for n in _CAMPLIB.findall(c.source)]
    for path in camplib_files(root, names)[:MAX_REFERENCE_FILES]:
        rel = str(path.relative_to(root))
        docs.append(Document(rel, [(rel, path.read_text(encoding="utf-8"))], reference=True))
    return docs


def camplib_files(root: Path, names: list[str]) -> list[Path]:
    """The module files behind dotted names: `camplib.attention.attend` -> camplib/attention.py, a
    package named whole (`camplib.kernels`) -> each of its modules."""
    found: list[Path] = []
    for name in dict.fromkeys(names):
        parts = name.split(".")
        for n in range(len(parts), 1, -1):   # camplib itself is no answer key
            base = root.joinpath(*parts[:n])
            if base.with_suffix(".py").is_file():
                found.append(base.with_suffix(".py"))
                break
            if (base / "__init__.py").is_file():
                found += sorted(base.rglob("*.py")) if n == len(parts) else [base / "__init__.py"]
                break
    return [p for p in dict.fromkeys(found) if p.stat().st_size > 0]


# ---- comparison -----------------------------------------------------------------------------------

def _fingerprint(doc: Document, template: "Template"):
    """copydetect's fingerprints of the document, the code it shares line for line with the
    released exercise cells blanked first (`blank_template`)."""
    from copydetect import CodeFingerprint

    doc.compared = blank_template(doc.text, template.lines)
    return CodeFingerprint(f"{doc.owner}.py", NOISE, 1, boilerplate=template.hashes, language="python",
                           fp=io.StringIO(doc.compared))


def blank_template(text: str, lines: frozenset[str]) -> str:
    """`text` with the tokens of its template lines (stripped, in `lines`) turned into spaces.

    Fingerprints of the template alone miss the runs that start in a given signature or docstring
    and end in the first tokens of the body, which honest solutions share; blanking the given lines
    leaves only what the student wrote. A string (a docstring) is blanked only when all its lines
    are template lines, so that quotes stay paired; positions and line breaks are kept."""
    from pygments.lexers import PythonLexer
    from pygments.token import String

    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    given = [not line.strip() or line.strip() in lines for line in text.split("\n")]
    out = list(text)
    groups: list[list[int]] = []    # [start, end): a token, or a run of string tokens
    in_string = False
    for index, ttype, value in PythonLexer().get_tokens_unprocessed(text):
        is_string = ttype in String
        if is_string and in_string:
            groups[-1][1] = index + len(value)
        else:
            groups.append([index, index + len(value)])
        in_string = is_string
    for start, end in groups:
        first, last = bisect.bisect_right(starts, start) - 1, bisect.bisect_right(starts, max(start, end - 1)) - 1
        if all(given[first:last + 1]):
            for i in range(start, end):
                if out[i] != "\n":
                    out[i] = " "
    return "".join(out)


@dataclass
class Template:
    """What every student got: the lines of the released exercise cells and of the code the text
    shows (stripped), and the fingerprints of all the released notebook's code."""
    lines: frozenset[str]
    hashes: np.ndarray

    @classmethod
    def of(cls, code: list[str]) -> "Template":
        """`code` as `template_document` gives it: `code[0]` holds the lines students are given."""
        return cls(frozenset(line.strip() for line in code[0].splitlines()) - {""}, boilerplate_hashes(code))


def boilerplate_hashes(template: list[str]) -> np.ndarray:
    """Every fingerprint of each text (copydetect's boilerplate: removed from every document)."""
    from copydetect import CodeFingerprint

    hashes = set()
    for code in template:
        hashes |= CodeFingerprint("template.py", NOISE, 1, language="python", fp=io.StringIO(code)).hashes
    return np.unique(np.array(sorted(hashes), dtype=np.int64))


def _line_map(doc: Document, fp) -> np.ndarray:
    """The document line (1-based) of each tokenized position of `fp` (one past the end included).

    Tokenized position p was written at p plus the characters the tokenizer dropped before it
    (copydetect's offsets, made cumulative again: after a class name it records the name's length
    instead)."""
    if doc.line_map is None:
        positions = np.arange(len(fp.filtered_code) + 1, dtype=np.int64)
        raw = positions
        if len(fp.offsets):
            dropped = np.maximum.accumulate(fp.offsets[:, 1])
            raw = positions + dropped[np.clip(np.searchsorted(fp.offsets[:, 0], positions), 0, len(dropped) - 1)]
        # doc.compared (what was fingerprinted) has doc.text's length and line breaks
        newlines = np.flatnonzero(np.frombuffer(doc.text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32) == 10)
        doc.line_map = np.searchsorted(newlines, raw, side="left") + 1
    return doc.line_map


def compare(fa, fb) -> tuple[float, float, int]:
    """(share of a's fingerprinted code found in b, share of b's found in a, tokenized characters
    matched): copydetect's figures."""
    from copydetect import compare_files

    overlap, (sim_a, sim_b), _ = compare_files(fa, fb)
    return float(sim_a), float(sim_b), int(overlap)


def matched_blocks(a: Document, fa, b: Document, fb) -> list[tuple[int, int, int, int]]:
    """The matched lines, (a's first, a's last, b's first, b's last) per block.

    The blocks follow the shared fingerprints in a's order, a block going on while the match goes
    on at the same pace in b, within one cell or file on each side; a fingerprint repeated all
    over a document is followed at its first `_VOTERS` places only."""
    pairs = sorted((int(i), h) for h in fa.hashes & fb.hashes for i in fa.hash_idx[h][:_VOTERS])
    map_a, map_b = _line_map(a, fa), _line_map(b, fb)
    end_a, end_b = len(map_a) - 1, len(map_b) - 1
    runs: list[list[int]] = []   # [a line, a last line, b line, b last line, last i, last j]
    for i, h in pairs:
        js = np.array(fb.hash_idx[h][:_VOTERS], dtype=np.int64)
        line, line_end = int(map_a[i]), int(map_a[min(i + NOISE - 1, end_a)])
        run = runs[-1] if runs else None
        if run is not None and 0 < i - run[4] <= NOISE and a.part(line) == a.part(run[0]):
            want = run[5] + (i - run[4])
            j = int(js[np.argmin(np.abs(js - want))])
            if abs(j - want) <= NOISE // 2 and b.part(int(map_b[j])) == b.part(run[2]):
                run[1], run[3] = max(run[1], line_end), max(run[3], int(map_b[min(j + NOISE - 1, end_b)]))
                run[4], run[5] = i, j
                continue
        j = int(js[0])
        runs.append([line, line_end, int(map_b[j]), int(map_b[min(j + NOISE - 1, end_b)]), i, j])
    blocks = {(*a.trim(r[0], min(r[1], a.last_line(r[0]))), *b.trim(r[2], min(r[3], b.last_line(r[2]))))
              for r in runs}
    return _merge(sorted(blocks), a, b)


def _merge(blocks, a: Document, b: Document, gap: int = 3):
    """Neighbouring blocks (within `gap` lines on both sides, in the same order, in the same cell or
    file) as one; a block inside the one before it is dropped."""
    merged: list[list[int]] = []
    for a0, a1, b0, b1 in blocks:
        last = merged[-1] if merged else None
        if last and a0 - last[1] <= gap and -gap <= b0 - last[3] <= gap \
                and a.part(a0) == a.part(last[0]) and b.part(b0) == b.part(last[2]):
            last[1], last[3] = max(a1, last[1]), max(b1, last[3])
        else:
            merged.append([a0, a1, b0, b1])
    return [tuple(m) for m in merged]


def flagged(similarity: float, overlap: int) -> bool:
    return similarity >= THRESHOLD and overlap >= MIN_OVERLAP


def compare_lab(lab: Lab, spec: LabSpec, root: Path, students: list[tuple[str, Path]], caps: GradingCaps,
                deadline: float) -> LabReport:
    """Every submission of one lab against the answer key and against each classmate."""
    report = LabReport(lab)
    template, refs = _course_side(lab, spec, root)
    report.references = [d.owner for d, _ in refs]
    subs = []
    for student, folder in students:
        if time.monotonic() > deadline:
            report.notes.append(f"time budget ({BUDGET_SECONDS} s) spent: {student} and the submissions after it "
                                "were not compared")
            break
        try:
            doc = student_document(student, folder, spec, caps)
            subs.append((doc, _fingerprint(doc, template)))
            report.compared.append(student)
            if doc.note:
                report.notes.append(f"{student}: {doc.note}")
        except Exception as exc:   # that submission only: it is listed, the others are compared
            report.notes.append(f"{student}: not compared ({type(exc).__name__}: {exc})")
    found = _compare_pairs(report, subs, refs, deadline)
    found.sort(key=lambda f: (-max(f[4], f[5]), f[0].owner, f[2].owner))
    for n, (doc, fp, other, ofp, sim, other_sim, overlap) in enumerate(found):
        blocks = []
        if n < MAX_SHOWN:   # side by side: the most similar pairs (a class of copies would fill pages)
            try:
                blocks = [(doc.where(a0, a1), _excerpt(doc, a0, a1), other.where(b0, b1), _excerpt(other, b0, b1))
                          for a0, a1, b0, b1 in matched_blocks(doc, fp, other, ofp)]
            except Exception as exc:
                report.notes.append(f"{doc.owner} with {other.owner}: lines not shown ({type(exc).__name__}: {exc})")
        report.matches.append(Match(lab.id, doc.owner, other.owner, "reference" if other.reference else "classmate",
                                    sim, other_sim, overlap, blocks))
    if len(found) > MAX_SHOWN:
        report.notes.append(f"{len(found)} pairs flagged: the lines of the first {MAX_SHOWN} are shown")
    return report


_COURSE_SIDE: dict[str, tuple] = {}   # digest of the course's code for a lab -> (its Template, its references)


def _course_side(lab: Lab, spec: LabSpec, root: Path) -> tuple["Template", list[tuple]]:
    """The lab's template and its answer key with their fingerprints: functions of the course's
    code only, so fingerprinted once per process for the same code (a lab graded again)."""
    code = template_document(spec, lab.release_path(root))
    docs = reference_documents(lab, root)
    key = hashlib.sha256(json.dumps([NOISE, code, [(d.owner, d.text) for d in docs]]).encode()).hexdigest()
    if key not in _COURSE_SIDE:
        while len(_COURSE_SIDE) >= 32:
            _COURSE_SIDE.pop(next(iter(_COURSE_SIDE)))
        template = Template.of(code)
        _COURSE_SIDE[key] = (template, [(d, _fingerprint(d, template)) for d in docs])
    return _COURSE_SIDE[key]


def _compare_pairs(report: LabReport, subs, refs, deadline: float) -> list[tuple]:
    """(doc, its fingerprints, other, its fingerprints, shares both ways, overlap) of each flagged pair."""
    found = []
    for n, (doc, fp) in enumerate(subs):
        for other, ofp in refs + subs[n + 1:]:
            if time.monotonic() > deadline:
                report.notes.append(f"time budget ({BUDGET_SECONDS} s) spent: the comparisons of {doc.owner} "
                                    "and of the submissions after it were not all made")
                return found
            try:
                sim, other_sim, overlap = compare(fp, ofp)
            except Exception as exc:
                report.notes.append(f"{doc.owner} with {other.owner}: not compared ({type(exc).__name__}: {exc})")
                continue
            if flagged(sim if other.reference else max(sim, other_sim), overlap):
                found.append((doc, fp, other, ofp, sim, other_sim, overlap))
    return found


def _excerpt(doc: Document, first: int, last: int, limit: int = 60) -> str:
    """Lines first..last of a document, each cell or file they cross announced by a comment line."""
    starts = {start: origin for start, origin in doc.origins}
    lines = []
    for n, line in enumerate(doc.text.splitlines()[first - 1:last], start=first):
        if n in starts and n != first:
            lines.append(f"# --- {starts[n]} ---")
        lines.append(line)
    return "\n".join(lines[:limit]) + (f"\n... ({len(lines) - limit} more lines)" if len(lines) > limit else "")


# ---- outputs -------------------------------------------------------------------------------------

def write_similarity(out: Path, root: Path, labs: dict[str, tuple[Lab, LabSpec, list[str]]], caps: GradingCaps
                     ) -> list[LabReport]:
    """similarity.html and similarity.csv in `out` for the submissions graded there:
    `labs` maps a lab id to (Lab, its LabSpec, the students whose submission it compares)."""
    deadline = time.monotonic() + BUDGET_SECONDS
    reports = []
    for lab_id in sorted(labs):
        lab, spec, students = labs[lab_id]
        folders = [(s, submission_folder(out, s, lab.name)) for s in sorted(students)]
        try:
            reports.append(compare_lab(lab, spec, root, [(s, f) for s, f in folders if f.is_dir()], caps, deadline))
        except Exception as exc:   # the lab's own files: say so, go on with the next lab
            reports.append(LabReport(lab, notes=[f"not compared: {type(exc).__name__}: {exc}"]))
    _write_csv(reports, out / "similarity.csv")
    (out / "similarity.html").write_text(_html(reports), encoding="utf-8")
    return reports


COLUMNS = ["lab", "student", "other", "kind", "similarity", "other_similarity", "matched_chars", "lines"]


def _write_csv(reports: list[LabReport], path: Path) -> None:
    def rows():
        for r in reports:
            for m in r.matches:
                lines = "; ".join(f"{a} = {b}" for a, _, b, _ in m.blocks)
                yield (m.lab, m.student, m.other, m.kind, round(m.similarity, 3), round(m.other_similarity, 3),
                       m.overlap, lines[:2000])
    write_inert_csv(path, COLUMNS, rows())


def summary_line(out: Path) -> str:
    """What `camp grade` prints about the report."""
    try:
        with open(out / "similarity.csv", newline="", encoding="utf-8") as f:
            n = sum(1 for _ in csv.reader(f)) - 1
    except OSError:
        return "similarity: no report was written"
    return (f"similarity: {n} pair{'s' if n != 1 else ''} flagged for review (scores unchanged): "
            f"{out / 'similarity.html'}")


def _html(reports: list[LabReport]) -> str:
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">",
             f"<title>LLM Camp code similarity</title><style>{_STYLE}</style></head><body>",
             "<h1>Code similarity</h1>",
             f"<p class='note'>Each submission's own code against the lab's answer key (its solution and camplib "
             f"modules) and against every classmate's, by copydetect's winnowing fingerprints (as MOSS): names, "
             f"layout, comments and docstrings do not hide a match; the released template is ignored. Flagged: "
             f"at least {THRESHOLD:.0%} of one side's code found in the other, over at least {MIN_OVERLAP} "
             f"tokenized characters. A flag asks you to look at the lines below; no score was changed.</p>"]
    for r in reports:
        parts.append(f"<h2>{html_text(r.lab.id)}</h2><p>{len(r.compared)} submissions compared with each other and "
                     f"with {html_text(', '.join(r.references) or 'no reference')}; {len(r.matches)} "
                     f"pair{'s' if len(r.matches) != 1 else ''} flagged.</p>")
        parts += [f"<p class='note'>{html_text(n, 400)}</p>" for n in r.notes]
        if r.matches:
            parts.append("<table><tr><th>student</th><th>matches</th><th>kind</th><th>share of the student's code"
                         "</th><th>share of the other</th><th>matched</th></tr>")
            parts += [f"<tr><td>{_link(r.lab.id, i, m)}</td>"
                      f"<td>{html_text(m.other, 120)}</td><td>{m.kind}</td><td class='num'>{m.similarity:.0%}</td>"
                      f"<td class='num'>{m.other_similarity:.0%}</td><td class='num'>{m.overlap}</td></tr>"
                      for i, m in enumerate(r.matches)]
            parts.append("</table>")
        for i, m in enumerate(r.matches):
            if not m.blocks:
                continue
            parts.append(f"<h3 id='{_anchor(r.lab.id, i)}'>{html_text(m.student, 80)} and "
                         f"{html_text(m.other, 120)}</h3><table><tr><th>{html_text(m.student, 80)}</th>"
                         f"<th>{html_text(m.other, 120)}</th></tr>")
            parts += [f"<tr><td>{html_text(wa)}<pre>{html_text(ca, keep=chr(10) + chr(9))}</pre></td>"
                      f"<td>{html_text(wb)}<pre>{html_text(cb, keep=chr(10) + chr(9))}</pre></td></tr>"
                      for wa, ca, wb, cb in m.blocks]
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _link(lab: str, i: int, m: Match) -> str:
    name = html_text(m.student, 80)
    return f"<a href='#{_anchor(lab, i)}'>{name}</a>" if m.blocks else name


def _anchor(lab: str, i: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', lab)}-{i}"
