"""The ``journaled`` command line."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

import journaled
from events.memory_audit import when


@click.group()
@click.version_option(package_name="journaled")
def main() -> None:
    """journaled: an event-sourced actor runtime for AI agents."""


@main.command()
@click.option(
    "--url",
    default=None,
    help="Journal URL (default: $JOURNALED_URL, then ./.journaled/journal.sqlite).",
)
def demo(url: str | None) -> None:
    """Show memory whose every change is an event: a supersession and its why."""
    console = Console()
    with journaled.open(url) as rt:
        start = rt.journal.position()
        console.print(
            Panel.fit(
                f"journal: [bold]{rt.journal.url}[/]  (position {start})",
                title="journaled demo",
            )
        )
        mem = rt.memory
        old = mem.remember(
            "The staging API listens on port 8080",
            conflict_key="staging-api-port",
            source="docs/runbook.md",
        )
        mem.remember("Deploys go through the staging cluster first", domain="ops")
        mem.remember("Prefers concise answers with code first", scope="user")
        new = mem.remember(
            "The staging API moved to port 9090 (token=abc123 rotated)",
            conflict_key="staging-api-port",
            source="incident #42",
        )
        table = Table(title="Search: 'staging api port'", show_lines=False)
        table.add_column("fact")
        table.add_column("scope")
        table.add_column("text")
        for fact in mem.search("staging api port"):
            table.add_row(fact.id, fact.scope, fact.text)
        console.print(table)
        console.print(
            "The older fact is hidden from search: it was [bold]superseded[/]. Why?\n",
            highlight=False,
        )
        console.print(mem.why(old.id), highlight=False, markup=False)
        console.print(
            f"\nThe secret in the new fact never reached the journal: {new.text!r}\n",
            highlight=False,
            markup=False,
        )
        view = mem.as_of(position=start + 1)
        console.print(
            f"Time travel: as of position {start + 1} the store answered "
            f"{[f.text for f in view.search('staging api port')]}",
            highlight=False,
            markup=False,
        )
        console.print(
            f"\n{rt.journal.position() - start} events appended; journal now at position "
            f"{rt.journal.position()} ({when(new.created_at)}).",
            highlight=False,
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
