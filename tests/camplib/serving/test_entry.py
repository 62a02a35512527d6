"""`camp serve ...` hands every option to `python -m camplib.serving`'s parser."""
import pytest

from autograder.cli import main as camp
from camplib.serving.__main__ import parse_args


def test_camp_serve_dispatches_to_the_serving_parser(capsys):
    with pytest.raises(SystemExit) as info:
        camp(["serve", "--help"])
    assert info.value.code == 0 and "--max-batch" in capsys.readouterr().out
    args = parse_args(["ckpt.pt", "--max-batch", "8", "--dtype", "bf16"])
    assert (args.checkpoint, args.max_batch, args.dtype, args.host) == ("ckpt.pt", 8, "bf16", "127.0.0.1")
