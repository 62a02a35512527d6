"""Reading a class's submissions: SUBMISSIONS_DIR/<student>/<lab>/<notebook>.ipynb, or one
<student>.zip per student holding <lab>/... (optionally under a <student>/ folder).

Everything here treats the input as hostile. Each upload is copied (a folder) or unpacked (a zip)
into the grader's scratch space under the course's caps (`GradingCaps`, course/labs.toml
`[grading]`), checked while copying: names, depth, file count, bytes, zip ratio, then every
notebook's size, encoding, JSON nesting and cell sizes, all before anything parses or renders
it. Trees are walked iteratively without following links (lstat, O_NOFOLLOW), files are read
with a byte bound, and a problem becomes a `Rejected` for that student only, with a reason a
person can act on. Later steps only ever see the checked copy.

`submissions` (a class: collect), `files` (names, bounded copies and removal), `zips`,
`notebooks` (checks before parsing).
"""
from .files import SubmissionError, check_name, copy_plain_files, remove_tree, share_with_group
from .notebooks import check_notebook, read_notebook
from .submissions import STUDENT_ID, Rejected, Submission, collect

__all__ = ["STUDENT_ID", "Rejected", "Submission", "SubmissionError", "check_name", "check_notebook", "collect",
           "copy_plain_files", "read_notebook", "remove_tree", "share_with_group"]
