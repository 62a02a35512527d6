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


def test_a_machine_warning_goes_to_the_course_log_and_others_to_stderr(tmp_path):
    """torch's cuBLAS-context warning (an H200's autograd thread, a09's backward test) is about the
    machine: course log. Any other warning, the student's included, still reaches stderr. In a
    fresh interpreter: pytest replaces warnings.showwarning inside a test."""
    import os
    import subprocess
    import sys
    code = ("import warnings, autograder\n"
            "warnings.warn('Attempting to run cuBLAS, but there was no current CUDA context! "
            "Attempting to set the primary context... (Triggered internally at CublasHandlePool.cpp:335.)')\n"
            "warnings.warn('a student warning')\n")
    env = dict(os.environ, CAMP_LOG=str(tmp_path / "course.log"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "a student warning" in proc.stderr and "cuBLAS" not in proc.stderr, proc.stderr
    assert "UserWarning: Attempting to run cuBLAS" in (tmp_path / "course.log").read_text()
