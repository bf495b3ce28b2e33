"""`gpuplan completion bash`: a bash completion script generated from the parser itself, so every
subcommand and flag completes and a new flag completes without editing a script (zsh reads it after
`autoload -U bashcompinit && bashcompinit`). Flags that take a choice complete its values."""

from __future__ import annotations

import argparse
import shlex

from services.cli.common import Subparsers


def register(sub: Subparsers) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='Print a completion script; add `eval "$(gpuplan completion bash)"` to ~/.bashrc.',
        epilog='example:\n  eval "$(gpuplan completion bash)"\n  gpuplan est<TAB> --me<TAB>',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=["bash"], help="the shell (zsh: bashcompinit reads the bash one)")
    completion.set_defaults(handler=cmd_completion)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its actions here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]]]:
    """(the parser's flags, the choices of each flag that has them)."""
    flags: list[str] = []
    choices: dict[str, list[str]] = {}
    for action in parser._actions:
        for option in action.option_strings:
            flags.append(option)
            if action.choices is not None:
                choices[option] = [str(c) for c in action.choices]
    return flags, choices


def _paths(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command path ("", "plans", "plans submit", ...) and its parser."""
    out = {prefix: parser}
    for name, child in _subparsers(parser).items():
        out.update(_paths(child, f"{prefix} {name}".strip()))
    return out


def bash_script(parser: argparse.ArgumentParser) -> str:
    cases = []
    for path, node in sorted(_paths(parser).items()):
        flags, choices = _words(node)
        words = [*_subparsers(node), *flags]
        values = "".join(
            f'      {shlex.quote(flag)}) COMPREPLY=($(compgen -W {shlex.quote(" ".join(vals))} -- "$cur")); return;;\n'
            for flag, vals in sorted(choices.items())
        )
        cases.append(
            f"    {shlex.quote(path)})\n"
            f'      case "$prev" in\n{values}      esac\n'
            f'      COMPREPLY=($(compgen -W {shlex.quote(" ".join(words))} -- "$cur"));;\n'
        )
    return (
        "# gpuplan bash completion (gpuplan completion bash); generated from the command's own parser.\n"
        "_gpuplan() {\n"
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" path="" word i\n'
        "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
        '    word="${COMP_WORDS[i]}"\n'
        '    [[ "$word" == -* ]] && continue\n'
        '    case "$_gpuplan_paths" in *"|${path:+$path }$word|"*) path="${path:+$path }$word";; esac\n'
        "  done\n"
        '  case "$path" in\n' + "".join(cases) + "  esac\n"
        "}\n"
        f"_gpuplan_paths={shlex.quote('|' + '|'.join(p for p in sorted(_paths(parser)) if p) + '|')}\n"
        "complete -o default -F _gpuplan gpuplan\n"
    )


def hand_in(root: argparse.ArgumentParser) -> None:
    """Give the completion command the whole parser it describes; services.cli.main calls this once the
    parser is built (main imports every command module, so this one does not import main back)."""
    _subparsers(root)["completion"].set_defaults(root_parser=root)


def cmd_completion(args: argparse.Namespace) -> int:
    print(bash_script(args.root_parser), end="")
    return 0
