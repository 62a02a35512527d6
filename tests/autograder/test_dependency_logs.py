"""autograder.dependency_logs: the listed libraries' records go to the course log, nothing else's.
The end-to-end check (a lab's imports on a CPU with and without AVX512-BF16, stderr empty) is
tests/test_packaging.py::test_importing_transformers_and_peft_prints_nothing."""
import logging

import autograder  # noqa: F401  (routes, as every lab's setup cell does)
from autograder.dependency_logs import LOGGERS, course_log, route


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        self.names.append(record.name)


def test_a_listed_librarys_record_goes_to_the_course_log_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAMP_LOG", str(tmp_path / "logs" / "course.log"))
    assert course_log() == tmp_path / "logs" / "course.log"
    root = Kept()   # what reaches the root logger (and, with no handler there, stderr)
    logging.getLogger().addHandler(root)
    try:
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward: %s", "x")
        logging.getLogger("someone.else").warning("a student's or another library's warning")
    finally:
        logging.getLogger().removeHandler(root)
    assert "bitsandbytes.backends.cpu.ops WARNING: Failed to load CPU gemm_4bit_forward: x" in course_log().read_text()
    assert root.names == ["someone.else"], "only the listed libraries are routed"
    assert capsys.readouterr().err == ""


def test_an_unwritable_course_log_stays_silent(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CAMP_LOG", str(tmp_path / "file" / "course.log"))   # its folder is a file
    logging.getLogger("bitsandbytes").warning("lost")
    assert capsys.readouterr().err == ""


def test_route_is_idempotent():
    route()
    route()
    for name in LOGGERS:
        logger = logging.getLogger(name)
        ours = [h for h in logger.handlers if type(h).__name__ == "CourseLogHandler"]
        assert len(ours) == 1 and not logger.propagate, (name, logger.handlers)
