"""The `libra` command: parse arguments, call the library, print a table or one JSON object.

Each subcommand lives in its own module with `register(subparsers)` and a `run(args) -> int`.
Errors the user can fix print one line on stderr and exit 2; nothing prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from libra.cli._common import CLIError, one_line

_SUBCOMMANDS = ("plan", "trace", "route_eval", "simulate", "estimate", "profile", "run")


def _load_subcommand(name: str):
    import importlib

    try:
        return importlib.import_module(f"libra.cli.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"libra.cli.{name}":
            return None
        raise


def _is_user_error(exc: Exception) -> bool:
    """Errors about the user's input raised by modules loaded on demand (placement needs OR-Tools)."""
    placement = sys.modules.get("libra.planning.placement")
    return placement is not None and isinstance(exc, placement.PlacementError)


# The extra of pyproject.toml that brings each optional package a command may import lazily.
_EXTRA_OF = {
    "torch": "torch",
    "vllm": "vllm",
    "ray": "ray",
    "deepspeed": "deepspeed",
    "megatron": "megatron",
    "transformers": "all",
    "tokenizers": "all",
    "xxhash": "torch",
    "bpe_openai": "traces",
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) like every other `libra` error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="libra",
        description="Resource management for agentic RL post-training: plan GPU splits, route requests, simulate.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        module = _load_subcommand(name)
        if module is not None:
            module.register(sub)
    return parser


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` chose (`libra trace import`'s, say): the one whose --help lists the
    options its words may use, so that an argument no parser took is answered with that --help."""
    while True:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = subparsers[0].choices.get(getattr(args, subparsers[0].dest, None) or "") if subparsers else None
        if chosen is None:
            return parser
        parser = chosen


def main(argv: list[str] | None = None) -> int:
    from libra.spec import SpecError
    from libra.workloads import TraceError

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the subcommand's parser: "(see libra plan --help)", not the top one's
        _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args) or 0)
    except (CLIError, SpecError, TraceError) as exc:
        print(f"libra: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional engine (torch, vllm, ray, ...) the command needs is not installed
        extra = _EXTRA_OF.get((exc.name or "").split(".")[0])
        if extra is None:  # not an optional package: a broken install or a bug
            print(
                f"libra: internal error: {type(exc).__name__}: {one_line(str(exc))} (please report it)", file=sys.stderr
            )
            return 1
        print(
            f"libra: error: this command needs {exc.name!r}, which is not installed here "
            f"(pip install -c constraints.txt -e '.[{extra}]')",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:  # the reader went away (`libra plan --json | head`): nothing left to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # noqa: BLE001 - the contract is one line, never a traceback
        if _is_user_error(exc):
            print(f"libra: error: {one_line(str(exc))}", file=sys.stderr)
            return 2
        print(f"libra: internal error: {type(exc).__name__}: {one_line(str(exc))} (please report it)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("libra: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
