"""The CLI imports only the module of the command being run; help and typos still see them all."""

from __future__ import annotations

import pytest

from lmspec.compiler.cli.main import BUILTIN_COMMANDS, COMMAND_MODULES, _command_modules, run


def test_a_builtin_command_imports_no_command_module() -> None:
    assert _command_modules(["compile", "-o", "build", "parallel.tp=2"]) == ()
    assert _command_modules(["check", "--spec", "x.yaml"]) == ()


def test_a_module_command_imports_just_its_module() -> None:
    assert _command_modules(["plan", "--gpus", "64"]) == ("lmspec.compiler.cli.plan",)
    assert _command_modules(["hook", "compile-check"]) == ("lmspec.compiler.cli.hook",)
    assert _command_modules([]) == COMMAND_MODULES


@pytest.mark.parametrize("argv", [["--help"], ["bogus"]])
def test_help_and_unknown_commands_list_every_command(argv: list[str], capsys) -> None:
    assert _command_modules(argv) == COMMAND_MODULES
    with pytest.raises(SystemExit):
        run(argv)
    out = capsys.readouterr()
    listed = out.out + out.err
    names = [*BUILTIN_COMMANDS, *(m.removeprefix("lmspec.compiler.cli.") for m in COMMAND_MODULES)]
    assert all(name in listed for name in names)
