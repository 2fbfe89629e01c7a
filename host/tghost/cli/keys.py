"""cli.keys: ``tghost keygen``, the Ed25519 key pair for signed announcements or a caller's identity.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from tghost.cli.app import cli
from tghost.protocol.trust import write_key_pair
from tghost.system.paths import app_dir


def _default_key_prefix() -> Path:
    return app_dir() / "keys" / "announce"


@cli.command()
@click.option("--out", "prefix", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="PATH_PREFIX",
              help=f"Write PATH_PREFIX.key and PATH_PREFIX.pub [default: {_default_key_prefix()}].")
@click.option("--force", is_flag=True, help="Overwrite existing key files.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def keygen(prefix: Path | None, force: bool, as_json: bool) -> None:
    """Write an Ed25519 key pair for signed announcements.

    A host's key: the private key (.key, PKCS#8 PEM, mode 0600) goes to 'tghost run
    --signing-key'; the public key (.pub) to every directory that should trust this host:
    '--trusted-key' on tools/watch/call, or ToolDirectory(trusted=...). A caller's key (its
    identity): the private key goes to '--identity' on call/tools/mcp/inspect, the public key
    into the hosts' [access] policy (public-key = "PATH"). Refuses to overwrite without --force.
    """
    try:
        written = write_key_pair(prefix or _default_key_prefix(), force)
    except (FileExistsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"key_id": written.key_id, "private_key": str(written.private),
                               "public_key": str(written.public)}, indent=2))
        return
    click.echo(f"key id:      {written.key_id}")
    click.echo(f"private key: {written.private}  (keep secret)")
    click.echo(f"public key:  {written.public}  (share)")
    click.echo(f"a host's:    tghost run --signing-key {written.private}; directories trust it with "
               f"--trusted-key {written.public}")
    click.echo(f"a caller's:  tghost call --identity {written.private}; hosts grant it in [access] "
               f'(public-key = "{written.public}")')
