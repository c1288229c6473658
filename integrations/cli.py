"""The `prefixcache` command line: one typer app, one module per subcommand.

Each subcommand lives in its own module under `prefixcache.integrations` that exposes
`register(app: typer.Typer) -> None`. To add one (e.g. `serve`, `bench`), write the module
and append its import path to `SUBCOMMAND_MODULES`. Keep heavy imports (torch, a server)
inside the command functions so that `prefixcache --help` and `kv-size` stay fast.

Exit codes: 0 success, 2 bad usage or bad input (a one-line message, no traceback).
"""

from __future__ import annotations

import importlib

import typer

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "prefixcache.integrations.cli_kv_size",
    "prefixcache.integrations.cli_bench",
    "prefixcache.integrations.cli_serve",
    "prefixcache.integrations.cli_doctor",
    "prefixcache.integrations.cli_simulate",
    "prefixcache.integrations.cli_router",
)


def build_app() -> typer.Typer:
    """A fresh app with every module of SUBCOMMAND_MODULES registered on it."""
    app = typer.Typer(
        name="prefixcache",
        help="Prefix-cache-centric LLM middleware tools.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root() -> None:
        """Prefix-cache-centric LLM middleware tools."""

    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    return app


app = build_app()


def main() -> None:
    """Console-script entry point (`prefixcache ...`, also `python -m ...integrations.cli`)."""
    app(prog_name="prefixcache")


if __name__ == "__main__":
    main()
