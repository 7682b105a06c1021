"""The `edgeserve` command line: `edgeserve serve [flags]`."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from edgeserve import __version__, config, tls
from edgeserve.log import ROOT, setup_logging


def build_parser() -> config.ArgumentParser:
    """The top-level parser: `--version` and one subcommand per action (only `serve` so far)."""
    parser = config.ArgumentParser(
        prog="edgeserve", description="A lightweight LLM server for the edge."
    )
    parser.add_argument("--version", action="version", version=f"edgeserve {__version__}")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="load a GGUF model and serve it over HTTP",
        description="Load a GGUF model and serve it over HTTP.",
        epilog="Precedence: flag > environment > config file > default. "
        "Empty environment variables count as unset.",
    )
    config.add_arguments(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the process exit code (2 for bad usage or settings)."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args:
        parser.print_help(sys.stderr)
        return 2
    try:
        # Handles --help, --version and unknown commands; `serve` is then the only command left.
        parser.parse_args(args)
        settings = config.load_settings(args[1:], os.environ)
        ssl_context = tls.server_context(settings)
    except SystemExit as exc:  # --help or --version, already printed
        return exc.code if isinstance(exc.code, int) else 0
    except config.ConfigError as exc:
        print(f"edgeserve: error: {exc}", file=sys.stderr)
        return 2

    setup_logging(settings.log_level, settings.log_format, log_prompts=settings.log_prompts)
    logger = logging.getLogger(ROOT)
    for message in config.warnings(settings):
        logger.warning(message)
    from edgeserve.engine.llama.library import load_error

    if (reason := load_error()) is not None:
        print(f"edgeserve: error: llama.cpp does not load: {reason}", file=sys.stderr)
        return 2
    try:
        # Imported here so that bad settings are reported before aiohttp and llama.cpp load.
        from edgeserve.http.server import serve

        return serve(settings, ssl_context=ssl_context)
    except KeyboardInterrupt:
        return 0
