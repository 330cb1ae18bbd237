"""``journaled schema``: the JSON Schema of every stored event and every actor message (A4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from journaled import cli_render as render
from journaled.cli_common import emit, json_option, wants_json

if TYPE_CHECKING:
    from rich.table import Table


def schema_table(document: dict[str, Any]) -> Table:
    """Tabulate a schema document: tag, version, kind and fields of each type."""
    from rich.table import Table

    table = Table(title="events and messages (journaled schema --json for the JSON Schema)")
    table.title_justify = "left"
    table.add_column("tag", no_wrap=True)
    table.add_column("version", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("fields")
    for entry in [*document["events"], *document["messages"]]:
        version = entry.get("version")
        table.add_row(
            entry["tag"],
            "" if version is None else str(version),
            entry["kind"],
            ", ".join(entry["fields"]),
        )
    return table


@click.command()
@json_option
@click.pass_context
def schema(ctx: click.Context) -> None:
    """Print every stored event type and actor message type: tag, version, kind, fields.

    Generated from the types themselves (msgspec), so it is always the running release's. Opens
    no journal.

    JSON: one JSON Schema (2020-12) document {"$schema", events: [{tag, kind, version, topic,
    fields, schema: {"$ref"}}], messages: [{tag, kind, version, fields, schema: {"$ref"}}],
    envelope: {"$ref"}, "$defs"}; each "$ref" points into "$defs".
    """
    from journaled.events.protocol import json_schema

    document = json_schema()
    if wants_json(ctx):
        emit(document)
    else:
        render.console(soft_wrap=False).print(schema_table(document))
