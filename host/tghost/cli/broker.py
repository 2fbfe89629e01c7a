"""cli.broker: ``tghost broker``, the embedded pulsar-lite broker alone.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..broker import BrokerError, EmbeddedBroker, default_data_dir
from .app import cli
from .options import setup_logging


@cli.command()
@click.option("--port", type=click.IntRange(1, 65535), default=6650, show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help=f"Data directory [default: {default_data_dir()}].")
def broker(port: int, data_dir: Path | None) -> None:
    """Run only the embedded pulsar-lite broker, until Ctrl-C."""
    setup_logging("info")
    embedded = EmbeddedBroker(data_dir or default_data_dir(), port)
    try:
        embedded.start()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"embedded broker at {embedded.url} (data {embedded.data_dir}); Ctrl-C to stop", err=True)
    try:
        assert embedded.process is not None
        embedded.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()
