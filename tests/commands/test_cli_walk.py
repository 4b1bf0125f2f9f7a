"""Every sub-command's parser walked with bad arguments, generated from the parsers themselves (a
new command or option is covered without editing this file): each is one line on stderr, exit
status 2, no traceback. And: --version, help text and a default shown for every option, the top
help lists every command. Nothing here starts an engine."""
import argparse

import pytest

from streamtrace import __version__
from streamtrace.commands.cli import build_parser, main

REFUSABLE = ["x", "0", "-1", "99999", "/no/such/folder/out.png", "/no/such/file.toml"]
SKIP = (argparse._HelpAction, argparse._VersionAction)


def leaves(parser, path=()):
    """(command words, parser) of every runnable command: bridge lsl, cluster up, evaluate, ..."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaves(sub, path + (name,))


LEAVES = list(leaves(build_parser()))


def accepts(action, value) -> bool:
    try:
        v = action.type(value) if action.type else value
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return action.choices is None or v in action.choices


def options(parser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, SKIP)]


def required_args(parser, tmp_file) -> list[str]:
    """Valid values for what the command requires, so that the error is the one given."""
    argv = []
    for a in parser._actions:
        if isinstance(a, SKIP) or not (a.required or (not a.option_strings and a.nargs is None)):
            continue
        value = next(v for v in ([str(a.choices[0])] if a.choices else []) + ["1", str(tmp_file), "x"]
                     if accepts(a, v))
        argv += ([a.option_strings[-1]] if a.option_strings else []) + [value]
    return argv


def bad_arguments(parser):
    """(tokens, what the error line must name) for every way each option can be given wrongly."""
    yield ["--no-such-option"], "--no-such-option"
    for a in options(parser):
        flag = a.option_strings[-1]
        if a.nargs == 0:
            yield [f"{flag}=x"], flag
            continue
        yield [flag], flag                                  # the value is missing
        if a.choices is not None:
            yield [flag, "no-such-choice"], flag
        for value in REFUSABLE:
            if a.type is not None and not accepts(a, value):
                yield [flag, value], flag


CASES = [(path, tokens, named) for path, parser in LEAVES for tokens, named in bad_arguments(parser)]


def test_the_walk_covers_every_command():
    commands = {p[0] for p, _ in LEAVES}
    assert {"serve", "dashboard", "demo", "learn", "bench", "evaluate", "replay", "bridge", "worker",
            "cluster"} <= commands
    assert {("bridge", "lsl"), ("bridge", "mqtt"), ("cluster", "up"), ("cluster", "status")} <= {p for p, _ in LEAVES}
    assert len(CASES) > 150


@pytest.mark.parametrize("path, tokens, named", CASES, ids=[" ".join(c[0] + tuple(c[1])) for c in CASES])
def test_a_bad_argument_is_one_line_and_exit_2(path, tokens, named, capsys, tmp_path):
    (tmp_path / "f.csv").write_text("a\n1\n")
    parser = dict(LEAVES)[path]
    assert main(list(path) + required_args(parser, tmp_path / "f.csv") + tokens) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and named in err and err.startswith("streamtrace")


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=[" ".join(p) for p, _ in LEAVES])
def test_missing_required_arguments_are_one_line(path, capsys):
    parser = dict(LEAVES)[path]
    if not any(a.required or (not a.option_strings and a.nargs is None) for a in parser._actions):
        pytest.skip("nothing required")
    assert main(list(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "required" in err


@pytest.mark.parametrize("argv", [["demo", "--model", "transformer"], ["learn", "--model", "foo"],
                                  ["learn", "--hidden", "0"], ["demo", "--steps", "-5"], ["bench", "--port", "70000"],
                                  ["evaluate", "--config", "/no/such.toml"], ["replay", "f.csv", "--rate", "nan"],
                                  [], ["cluster"], ["bridge"]])
def test_the_reported_cases(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, words", [
    (["evaluate", "nope"], "unknown task 'nope'"),
    (["evaluate", "/no/such/rec.csv"], "no such file"),
    (["evaluate", "narma10", "--columns", "a"], "choose a file's columns"),
    (["replay", "/no/such/rec.csv"], "no such file"),
])
def test_bad_values_found_when_the_command_runs_are_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


@pytest.mark.parametrize("text, words", [("[model\n", "invalid TOML"), ('[model]\nstak = "gru"\n', "model.stak")],
                         ids=["bad TOML", "unknown key"])
@pytest.mark.parametrize("argv", [["serve", "--config"], ["bench", "--config"], ["evaluate", "narma10", "--config"],
                                  ["dashboard", "--config"], ["replay", "rows.csv", "--serve"]],
                         ids=lambda a: a[0])
def test_a_bad_config_file_is_one_line(argv, text, words, tmp_path, capsys):
    (tmp_path / "c.toml").write_text(text)
    assert main(argv + [str(tmp_path / "c.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_no_nats_server_is_one_line(capsys):
    try:
        import nats  # noqa: F401
        words = "cannot connect to NATS at nats://127.0.0.1:1"
    except ImportError:
        words = "pip install 'streamtrace[cluster]'"
    assert main(["cluster", "status", "--nats", "nats://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"streamtrace {__version__}"


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=[" ".join(p) for p, _ in LEAVES])
def test_every_option_has_help_and_shows_its_default(path):
    parser = dict(LEAVES)[path]
    formatter = parser._get_formatter()
    for a in options(parser):
        assert a.help and a.help.strip(), f"{' '.join(path)} {a.option_strings}: no help"
        shown = formatter._get_help_string(a) % {"default": a.default}
        assert a.nargs == 0 or "default" in shown, f"{' '.join(path)} {a.option_strings}: no default shown"
    parser.format_help()              # every help string formats


def test_top_help_lists_every_command_without_rst(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "``" not in text and "`" not in text
    for name in {p[0] for p, _ in LEAVES}:
        assert f"\n    {name} " in text or f"\n    {name}\n" in text, name


def test_stack_choices_are_the_built_in_stacks():
    from streamtrace.arguments import STACK_CHOICES
    from streamtrace.nn import STACKS
    assert tuple(STACK_CHOICES) == tuple(STACKS)


def test_the_installed_command_too():
    """Through ``python -m streamtrace`` (what the console script runs): exit status 2, one line."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "streamtrace", "demo", "--model", "transformer"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    assert out.stderr.startswith("streamtrace demo: error: argument --model: invalid choice: 'transformer'")


def test_a_command_builds_only_its_own_parser():
    """``streamtrace evaluate`` builds evaluate's parser only: none of the other commands' modules
    is imported for it, while the top-level --help still lists every command."""
    import subprocess
    import sys
    code = ("import sys\nfrom streamtrace.commands.cli import build_parser\n"
            "build_parser('evaluate').parse_args(['evaluate', 'narma10'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('streamtrace')))")
    loaded = eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert loaded == ["streamtrace", "streamtrace.arguments", "streamtrace.commands", "streamtrace.commands.cli"]
    from streamtrace.commands.cli import PARSERS, build_parser
    listed = build_parser().format_help()
    assert all(name in listed for name in PARSERS)
