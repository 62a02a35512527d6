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


def test_the_compile_flag_compiles_the_servers_decoding_step(capsys):
    from camplib.serving.__main__ import build
    app = build(parse_args(["--demo", "--compile", "--demo-config", '{"n_layer": 1}']))
    assert app.state.engine.compiled is not None, "--compile left the decoding step eager"
    assert "the decoding step compiled in" in capsys.readouterr().err
    assert build(parse_args(["--demo"])).state.engine.compiled is None, "compiled without --compile"
