"""similarity.html/.csv: a disguised copy of the answer key (camplib's module, in the cells or beside
the notebook) and classmates sharing code are flagged with the lines side by side; honest
independent solutions and blank templates are not; hostile submissions do not stop it; `camp
grade` writes it and changes no score."""
import ast
import csv
import json
import os
import re
import textwrap
import time

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.nbgrader_setup import SUBMITTED
from autograder.course.reference import solution_cells, student_notebook, write_submission
from autograder.reports import similarity
from autograder.reports.similarity import THRESHOLD, compare_lab, write_similarity

ROOT = repo_root()
LAB = "b01"
PLACEHOLDER = re.compile(r"^( *)# YOUR CODE HERE\n *raise NotImplementedError\(\)", re.M)

# Three students' own b01 code, written independently: each list holds the bodies that replace the
# released cell's placeholders, in order (masks: causal_mask then padding_mask; mha: __init__ then forward).
HONEST = {
    "ann": {
        "softmax": ["""
            biggest = torch.max(x, dim=dim, keepdim=True).values
            biggest = torch.nan_to_num(biggest, neginf=0.0)
            numer = (x - biggest).exp()
            denom = numer.sum(dim, keepdim=True).clamp_min(1e-30)
            return numer / denom"""],
        "masks": ["""
            if S is None:
                S = L
            rows = torch.arange(L, device=device).unsqueeze(1)
            cols = torch.arange(S, device=device).unsqueeze(0)
            return cols <= rows + (S - L)""", """
            idx = torch.arange(S, device=lengths.device).expand(len(lengths), S)
            keep = idx < lengths.unsqueeze(-1)
            return keep.view(len(lengths), 1, 1, S)"""],
        "sdpa": ["""
            if is_causal and attn_mask is not None:
                raise ValueError("both given")
            d = q.shape[-1]
            logits = torch.matmul(q, k.transpose(-1, -2)) * d ** -0.5
            if is_causal:
                n_q, n_k = q.shape[-2], k.shape[-2]
                attn_mask = torch.tril(torch.ones(n_q, n_k, dtype=torch.bool, device=q.device))
            if attn_mask is not None:
                if attn_mask.dtype is torch.bool:
                    logits = torch.where(attn_mask, logits, torch.full_like(logits, float("-inf")))
                else:
                    logits = logits + attn_mask
            probs = softmax(logits, dim=-1)
            return torch.matmul(probs, v)"""],
        "mha": ["""
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
            self.proj = nn.Linear(d_model, d_model, bias=bias)""", """
            batch, length, width = x.shape
            packed = self.qkv(x).reshape(batch, length, 3, self.n_heads, self.head_dim)
            packed = packed.permute(2, 0, 3, 1, 4)
            queries, keys, values = packed[0], packed[1], packed[2]
            out = scaled_dot_product_attention(queries, keys, values, attn_mask=attn_mask, is_causal=is_causal)
            out = out.permute(0, 2, 1, 3).contiguous().view(batch, length, width)
            return self.proj(out)"""],
    },
    "bob": {
        "softmax": ["""
            shift = x.amax(dim=dim, keepdim=True)
            shift = shift.masked_fill(torch.isinf(shift), 0)
            z = torch.exp(x - shift)
            total = z.sum(dim=dim, keepdim=True)
            total = torch.where(total == 0, torch.ones_like(total), total)
            return z / total"""],
        "masks": ["""
            S = S or L
            m = torch.zeros(L, S, dtype=torch.bool, device=device)
            for i in range(L):
                m[i, : S - L + i + 1] = True
            return m""", """
            pos = torch.arange(S, device=lengths.device)
            m = pos.view(1, S) < lengths.view(-1, 1)
            return m[:, None, None, :]"""],
        "sdpa": ["""
            if attn_mask is not None and is_causal:
                raise ValueError("attn_mask and is_causal are exclusive")
            scale = 1 / math.sqrt(q.size(-1))
            s = torch.einsum("...ld,...sd->...ls", q, k) * scale
            if is_causal:
                tri = torch.ones(s.shape[-2], s.shape[-1], device=q.device).tril().bool()
                s = s.masked_fill(~tri, float("-inf"))
            elif attn_mask is not None:
                s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
            w = softmax(s, -1)
            return torch.einsum("...ls,...sd->...ld", w, v)"""],
        "mha": ["""
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
            self.proj = nn.Linear(d_model, d_model, bias=bias)""", """
            B, T, C = x.shape
            h = self.n_heads
            q, k, v = torch.chunk(self.qkv(x), 3, dim=2)
            def heads(t):
                return t.reshape(B, T, h, C // h).permute(0, 2, 1, 3)
            y = scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask, is_causal)
            return self.proj(y.permute(0, 2, 1, 3).reshape(B, T, C))"""],
    },
    "cy": {
        "softmax": ["""
            finite_max = torch.clamp(x.detach().max(dim, keepdim=True)[0], min=-1e30)
            expd = (x - finite_max).exp() * (x > float("-inf"))
            return expd / expd.sum(dim, keepdim=True).clamp(min=1e-38)"""],
        "masks": ["""
            S = L if S is None else S
            i = torch.arange(L, device=device)[:, None] + (S - L)
            return torch.arange(S, device=device)[None, :] <= i""", """
            return torch.stack([torch.arange(S, device=lengths.device) < n for n in lengths])[:, None, None]"""],
    },
}


def _fill(grade_id: str, bodies: list[str]) -> str:
    """The released cell with its placeholders replaced by `bodies` (what a student writes)."""
    release = student_notebook(LAB, solve=False)
    cell = next(c.source for c in release.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    parts = iter(bodies)
    return PLACEHOLDER.sub(lambda m: textwrap.indent(textwrap.dedent(next(parts)).strip("\n"), m.group(1)), cell)


def _honest(student: str) -> dict[str, str]:
    return {gid: _fill(gid, bodies) for gid, bodies in HONEST[student].items()}


class _Disguise(ast.NodeTransformer):
    """Renames names, arguments and attributes; drops docstrings (ast.unparse then drops comments
    and lays the code out again)."""

    def __init__(self, names):
        self.names = names

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.names.get(node.arg, node.arg)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        node.attr = self.names.get(node.attr, node.attr)
        return node

    def generic_visit(self, node):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return super().generic_visit(node)


def disguise(code: str, names: dict[str, str]) -> str:
    """`code` renamed, without docstrings or comments, re-laid out and indented by 2 spaces."""
    text = ast.unparse(_Disguise(names).visit(ast.parse(code)))
    return re.sub(r"^((?:    )+)", lambda m: "  " * (len(m.group(1)) // 4), text, flags=re.M)


CAMPLIB = (ROOT / "camplib" / "attention.py").read_text()
RENAMES = {"scores": "logits", "weights": "probs", "attn_mask": "msk", "q": "query", "k": "key", "v": "value",
           "m": "mx", "e": "ex", "s": "tot", "x": "inp", "scale": "temperature", "cache": "kv_store"}
COPY = disguise(CAMPLIB, RENAMES)
HONEST_PADDING = '''def padding_mask(lengths, S):
    return (torch.arange(S, device=lengths.device)[None, :] < lengths[:, None])[:, None, None, :]
'''
SOLUTION = "solutions/b01_attention/b01_attention.ipynb"


def _defs(code: str) -> dict[str, tuple[int, int, str]]:
    """name -> (first line, last line, source) of each top-level function or class."""
    lines = code.splitlines(True)
    return {n.name: (n.lineno, n.end_lineno, "".join(lines[n.lineno - 1:n.end_lineno]))
            for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.fixture(scope="module")
def lab():
    catalog = Catalog.load()
    lab = catalog.get(LAB)
    return lab, LabSpec.from_notebook(lab.source_path(ROOT)), catalog.caps


def _write(lab, out, answers: dict[str, dict[str, str]], files: dict[str, dict[str, bytes]] = {}) -> list[str]:
    """Each student's submission in out/collected (nbgrader_setup.SUBMITTED), as `camp grade` leaves it (answers by grade_id,
    extra files beside the notebook); the ids of every student there."""
    for student in sorted(set(answers) | set(files)):
        write_submission(out / SUBMITTED, student, LAB, student_notebook(LAB, answers.get(student, {}), solve=False))
        for name, data in files.get(student, {}).items():
            (out / SUBMITTED / student / lab[0].name / name).write_bytes(data)
    return sorted(p.name for p in (out / SUBMITTED).iterdir())


def _compare(lab, out, answers=None, files={}):
    """Write the submissions (if any) and compare the class in out/collected (nbgrader_setup.SUBMITTED)."""
    lab_, spec, caps = lab
    students = _write(lab, out, answers or {}, files)
    return compare_lab(lab_, spec, ROOT, [(s, out / SUBMITTED / s / lab_.name) for s in students], caps,
                       time.monotonic() + 300)


def _pairs(report):
    return {(m.student, m.other): m for m in report.matches}


def _span(where: str) -> tuple[int, int]:
    a, b = re.search(r"lines? (\d+)(?:-(\d+))?$", where).groups()
    return int(a), int(b or a)


def test_a_disguised_copy_of_camplib_in_the_cells_is_flagged_with_its_lines(lab, tmp_path):
    copied = _defs(COPY)
    answers = {"cop": {"softmax": copied["softmax"][2],
                       "masks": copied["causal_mask"][2] + "\n\n" + HONEST_PADDING,   # camplib has no padding_mask
                       "sdpa": copied["scaled_dot_product_attention"][2],
                       "mha": copied["attend"][2] + "\n\n" + copied["MultiHeadAttention"][2]}}
    report = _compare(lab, tmp_path, answers)
    assert report.references == [SOLUTION, "camplib/attention.py"]
    match = _pairs(report)[("cop", "camplib/attention.py")]
    assert match.kind == "reference" and match.similarity >= 0.8, match.similarity
    # the sdpa cell is shown next to camplib's scaled_dot_product_attention, within 3 lines: a match
    # may start or end on a neighbouring line (the next `def` after two blank lines starts alike)
    first, last, _ = _defs(CAMPLIB)["scaled_dot_product_attention"]
    sdpa = [(theirs, lines) for ours, _, theirs, lines in match.blocks if "(sdpa)" in ours]
    assert sdpa, [b[0] for b in match.blocks]
    where, lines = max(sdpa, key=lambda b: _span(b[0])[1] - _span(b[0])[0])   # the body (its first line may
    a, b = _span(where)                                  # match the end of camplib's causal_mask too)
    assert where.startswith("camplib/attention.py") and first - 3 <= a and b <= last + 3 and b - a >= 10, where
    assert "torch.ones(L, S, dtype=torch.bool, device=q.device).tril()" in lines


def test_the_module_copied_beside_the_notebook_is_flagged(lab, tmp_path):
    imports = {"softmax": "from attn_helpers import softmax",
               "masks": "from attn_helpers import causal_mask, padding_mask",
               "sdpa": "from attn_helpers import scaled_dot_product_attention",
               "mha": "from attn_helpers import MultiHeadAttention"}
    report = _compare(lab, tmp_path, {"fil": imports}, {"fil": {"attn_helpers.py": COPY.encode()}})
    match = _pairs(report)[("fil", "camplib/attention.py")]
    assert match.similarity >= 0.8, match.similarity
    assert all(ours.startswith("attn_helpers.py, line") for ours, _, _, _ in match.blocks), match.blocks


def test_classmates_sharing_code_are_flagged_with_the_shared_lines(lab, tmp_path):
    ann = _honest("ann")
    shared = {"sdpa": disguise(ann["sdpa"], {"logits": "sc", "probs": "pr", "d": "dim_"}),
              "mha": disguise(ann["mha"], {"packed": "pk", "queries": "qq", "keys": "kk", "values": "vv"})}
    report = _compare(lab, tmp_path, {"ann": ann, "bob": _honest("bob"), "cyd": {**_honest("cy"), **shared}})
    pairs = _pairs(report)
    assert set(pairs) == {("ann", "cyd")}, {k: (m.similarity, m.other_similarity) for k, m in pairs.items()}
    match = pairs[("ann", "cyd")]
    assert match.kind == "classmate" and max(match.similarity, match.other_similarity) >= THRESHOLD
    # the blocks of 5 lines or more pair the copied cells (shorter ones: a phrase both cells
    # hold, such as `attn_mask=attn_mask, is_causal=is_causal`)
    cells = {(re.match(r"cell \d+ \((\w+)\)", ours).group(1), re.match(r"cell \d+ \((\w+)\)", theirs).group(1))
             for ours, _, theirs, _ in match.blocks if _span(ours)[1] - _span(ours)[0] >= 4}
    assert cells == {("sdpa", "sdpa"), ("mha", "mha")}, [(b[0], b[2]) for b in match.blocks]
    # ann's side of the sdpa block is the body she wrote (after the given signature and docstring),
    # first to last line, within a line
    ours = max((o for o, _, _, _ in match.blocks if "(sdpa)" in o), key=lambda o: _span(o)[1] - _span(o)[0])
    lines = ann["sdpa"].splitlines()
    body = [i + 1 for i, line in enumerate(lines) if "is_causal and attn_mask" in line or "matmul(probs" in line]
    a, b = _span(ours)
    assert abs(a - body[0]) <= 1 and abs(b - body[1]) <= 1, (ours, body)


def test_honest_solutions_and_blank_templates_are_not_flagged(lab, tmp_path, monkeypatch):
    students = {"ann": _honest("ann"), "bob": _honest("bob"), "blank1": {}, "blank2": {},
                "half": {"softmax": _honest("cy")["softmax"]}}   # the template kept, one exercise done
    report = _compare(lab, tmp_path, students)
    assert report.compared == ["ann", "blank1", "blank2", "bob", "half"] and not report.notes
    assert report.matches == []
    # with a margin: every pair's figure, nothing filtered, stays under 0.6 x the threshold (the
    # copies above score >= 0.8, classmates sharing two exercises >= 0.5), and a blank template
    # shares nothing with anyone
    monkeypatch.setattr(similarity, "THRESHOLD", 0.0)
    monkeypatch.setattr(similarity, "MIN_OVERLAP", 0)
    figures = {(m.student, m.other): m.similarity if m.kind == "reference" else max(m.similarity, m.other_similarity)
               for m in _compare(lab, tmp_path).matches}
    assert len(figures) == 5 * 2 + 10, "every pair and every reference was compared"
    assert max(figures.values()) < 0.6 * THRESHOLD, figures
    assert all(v == 0 for k, v in figures.items() if "blank1" in k or "blank2" in k), figures


def test_the_reference_solution_itself_is_flagged(lab, tmp_path):
    report = _compare(lab, tmp_path, {"ada": solution_cells(LAB), "bob": _honest("bob")})
    assert set(_pairs(report)) == {("ada", SOLUTION)}



def test_the_course_side_is_fingerprinted_once_per_process_for_the_same_code(lab, tmp_path, monkeypatch):
    monkeypatch.setattr(similarity, "_COURSE_SIDE", {})
    made = []
    real = similarity.Template.of
    monkeypatch.setattr(similarity.Template, "of", staticmethod(lambda code: made.append(1) or real(code)))
    first = _compare(lab, tmp_path / "one", {"ada": solution_cells(LAB)})
    again = _compare(lab, tmp_path / "two", {"ada": solution_cells(LAB)})
    assert len(made) == 1 and _pairs(first).keys() == _pairs(again).keys() == {("ada", SOLUTION)}
    docs = similarity.reference_documents
    monkeypatch.setattr(similarity, "reference_documents",
                        lambda *a: [similarity.Document(d.owner, d.parts + [("more", "x = 1\n")], reference=True)
                                    for d in docs(*a)])
    _compare(lab, tmp_path / "three", {"ada": solution_cells(LAB)})
    assert len(made) == 2, "other course code is fingerprinted anew"


EVIL = "<script>alert(1)<\\/script>\u202e\ud800"


def test_hostile_submissions_are_listed_and_the_others_compared(lab, tmp_path):
    lab_, spec, caps = lab
    junk = os.urandom(300_000)
    answers = {"ann": _honest("ann"), "bob": _honest("bob"),
               "cop": {"sdpa": _defs(COPY)["scaled_dot_product_attention"][2].replace("\n", "  # EVIL\n", 3)},
               "huge": {"softmax": "(" * 900_000}, "junk": {}, "nest": {"sdpa": "[" * 50_000 + "\n" + "x = '''" * 1000},
               "notjson": {}, "meta": {}}
    files = {"junk": {"helper.py": junk, "<b>x\u202e.py": b"\x00" * 1000, "data.bin": junk},
             "huge": {"big.py": b"x = 1\n" * 200_000}}
    students = _write(lab, tmp_path, answers, files)
    folder = tmp_path / SUBMITTED
    (folder / "notjson" / lab_.name / lab_.notebook).write_text("{" * 10)
    nb = json.loads((folder / "meta" / lab_.name / lab_.notebook).read_text())
    nb["cells"][7]["metadata"]["nbgrader"] = "solution"      # student-controlled metadata of the wrong type
    (folder / "meta" / lab_.name / lab_.notebook).write_text(json.dumps(nb))
    cop = folder / "cop" / lab_.name / lab_.notebook   # markup, bidi and a lone surrogate (JSON allows it)
    cop.write_text(cop.read_text().replace("# EVIL", "# " + json.dumps(EVIL)[1:-1]))
    start = time.monotonic()
    reports = write_similarity(tmp_path, ROOT, {LAB: (lab_, spec, students)}, caps)
    elapsed = time.monotonic() - start
    assert elapsed < 120, elapsed
    report = reports[0]
    assert {"ann", "bob", "cop", "huge", "junk", "nest"} <= set(report.compared), report.notes
    assert set(_pairs(report)) == {("cop", "camplib/attention.py")}, _pairs(report)
    assert any(n.startswith("notjson: not compared") for n in report.notes), report.notes
    assert any(n.startswith("huge: only its first") for n in report.notes), report.notes
    # the page and the sheet stay inert
    html = (tmp_path / "similarity.html").read_text(encoding="utf-8")
    assert "<script" not in html and "\u202e" not in html and "\ud800" not in html and "&lt;script&gt;" in html
    assert "\\u202e" in html and "\\ud800" in html, "shown as visible escapes"
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", html)
    with open(tmp_path / "similarity.csv", newline="", encoding="utf-8") as f:
        assert [(r["student"], r["other"]) for r in csv.DictReader(f)] == [("cop", "camplib/attention.py")]


def test_a_failing_comparison_never_stops_the_grade_sheet(tmp_path, monkeypatch):
    import autograder.grading.grade as grade_module
    from autograder.reports.grades_csv import GradeRow

    def broken(*args, **kwargs):
        raise RuntimeError("<b>copydetect broke</b>")

    monkeypatch.setattr(grade_module, "write_similarity", broken)
    run = grade_module._Run(tmp_path, Catalog.load().caps, ROOT)
    run.add(GradeRow("ada", LAB, 12.0, 12.0, "graded"))
    run.write_summaries()
    assert "ada" in (tmp_path / "grades.csv").read_text()
    html = (tmp_path / "similarity.html").read_text()
    assert "could not be made" in html and "&lt;b&gt;copydetect broke" in html
    assert similarity.summary_line(tmp_path) == "similarity: no report was written"


@pytest.mark.slow
def test_camp_grade_writes_the_report_and_keeps_the_scores(tmp_path, capsys):
    from autograder.cli import main

    subs = tmp_path / "subs"
    write_submission(subs, "ada", LAB, student_notebook(LAB))                       # the answer key
    write_submission(subs, "bob", LAB, student_notebook(LAB, _honest("bob"), solve=False))
    out = tmp_path / "ws"
    assert main(["grade", str(subs), "--out", str(out), "--isolation", "none"]) == 0
    printed = capsys.readouterr().out
    assert f"similarity: 1 pair flagged for review (scores unchanged): {out / 'similarity.html'}" in printed
    with open(out / "similarity.csv", newline="") as f:
        flags = [(r["student"], r["other"], r["kind"]) for r in csv.DictReader(f)]
    assert flags == [("ada", SOLUTION, "reference")]
    with open(out / "grades.csv", newline="") as f:
        scores = {r["student"]: float(r["score"]) for r in csv.DictReader(f)}
    assert scores == {"ada": 12.0, "bob": 12.0}, "a flag never changes a score (bob's code is correct too)"
    html = (out / "similarity.html").read_text()
    assert "2 submissions compared" in html and "1 pair flagged" in html


def test_the_answer_key_is_the_module_behind_each_name():
    files = similarity.camplib_files(ROOT, ["camplib.attention.attend", "camplib.kernels", "camplib.parallel.DataParallel",
                                            "camplib.attention", "camplib.no_such_module"])
    rel = [str(p.relative_to(ROOT)) for p in files]
    assert rel[0] == "camplib/attention.py" and rel.count("camplib/attention.py") == 1
    assert "camplib/kernels/flash.py" in rel and "camplib/parallel/__init__.py" in rel
    assert all(r.startswith(("camplib/attention.py", "camplib/kernels/", "camplib/parallel/__init__.py")) for r in rel), rel


def test_given_lines_are_blanked_and_strings_stay_paired():
    given = frozenset({"def softmax(x, dim=-1):", '"""', "raise NotImplementedError()"})
    text = 'def softmax(x, dim=-1):\n    """Mine.\n    """\n    return x.exp() / x.exp().sum(dim)\n'
    out = similarity.blank_template(text, given)
    assert len(out) == len(text) and out.count("\n") == text.count("\n"), "positions and lines kept"
    assert out.splitlines()[0].strip() == "", "the given signature is blanked"
    assert '"""Mine.\n    """' in out, "a docstring with a line of the student's stays whole"
    assert "return x.exp() / x.exp().sum(dim)" in out
    whole = 'def softmax(x, dim=-1):\n    """\n    """\n'
    assert similarity.blank_template(whole, given).strip() == "", "a string on given lines only is blanked whole"


def test_code_the_lab_text_shows_is_template():
    """p03's text shows how to call the service with openai's client: students who paste it share it
    with the course, not with each other."""
    lab = Catalog.load().get("p03")
    code = similarity.template_document(LabSpec.from_notebook(lab.source_path(ROOT)), lab.release_path(ROOT))
    template = similarity.Template.of(code)
    line = 'client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")'
    assert line in template.lines
    assert similarity.blank_template(f"x = 1\n{line}\n", template.lines).split("\n")[1].strip() == ""
