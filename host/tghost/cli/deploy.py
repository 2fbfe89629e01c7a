"""cli.deploy: ``tghost pulsar policies``, what an Apache Pulsar cluster needs before tghost
hosts announce and serve on it (docs/protocol.md §4.10).
"""

from __future__ import annotations

import json
import re

import click

from tghost.cli.app import cli
from tghost.protocol.deployment import DEFAULT_NAMESPACE, Policies, admin_commands, check_role, grants, rest_calls


@cli.group()
def pulsar() -> None:
    """Set up an Apache Pulsar cluster for tghost."""


@pulsar.command()
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True, metavar="TENANT/NAMESPACE",
              help="The namespace of the announcement topics (that of --descriptors-topic).")
@click.option("--host-role", default="<host-role>", show_default=True,
              help="The Pulsar role of the hosts: they produce and consume announcements.")
@click.option("--agent-role", default="<agent-role>", show_default=True,
              help="The Pulsar role of the agents (directories, callers): they read announcements, send requests "
                   "and read answers.")
@click.option("--cluster", default=None, metavar="NAME",
              help="The cluster a new tenant may use (pulsar-admin: default every cluster; REST: required, "
                   "else printed as <cluster>).")
@click.option("--retention-size", default="1G", show_default=True, metavar="SIZE",
              help="The retention's size bound per topic, in M or G (e.g. 4G): at least twice one epoch's "
                   "announcements, about 0.2 MB per host of 100 tools (docs/internals/scale.md).")
@click.option("--format", "fmt", type=click.Choice(["admin", "rest"]), default="admin", show_default=True,
              help="pulsar-admin command lines, or admin REST calls (METHOD PATH [JSON body]).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs: the namespace and the lines.")
def policies(namespace: str, host_role: str, agent_role: str, cluster: str | None, retention_size: str, fmt: str,
             as_json: bool) -> None:
    """Print the Pulsar set-up tghost needs on a cluster with authorization (docs/protocol.md §4.10).

    It creates the tenant and the namespaces if they are missing (Pulsar never creates them):
    the announcement namespace (--namespace), and the request and response namespaces of the
    services' topics (tg/request, tg/response). It sets the announcement namespace's retention,
    compaction and inactive-topic deletion, then grants each role what it needs: hosts produce
    and consume announcements and requests (their cancels, probes and replay marks) and produce
    answers; agents consume announcements, produce requests and consume answers. The
    pulsar-admin lines are safe to run twice: a set-up job runs exactly what this prints.
    Without --host-role and --agent-role the roles are placeholders, which a shell refuses.
    Talks to nothing; exits 2 for a namespace that is not TENANT/NAMESPACE or a role or
    cluster name a shell line cannot carry.

    With --json: {"tenants", "namespaces": {"config", "request", "response"}, "permissions":
    [{"namespace", "role", "actions"}], "namespace" (the announcement namespace), "format",
    "lines"}.
    """
    size = re.fullmatch(r"([1-9][0-9]*)([MG])", retention_size)
    if size is None:
        raise click.BadParameter(f"{retention_size!r} is not a size: write e.g. 1G or 512M",
                                 param_hint="--retention-size")
    try:
        wanted = Policies(namespace=namespace, retention_mb=int(size[1]) * (1024 if size[2] == "G" else 1),
                          cluster=cluster)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cluster" if "role name" in str(exc) else "--namespace") \
            from None
    for role, option in ((host_role, "--host-role"), (agent_role, "--agent-role")):
        if not (role.startswith("<") and role.endswith(">")):  # a placeholder is printed as it is
            try:
                check_role(role)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=option) from None
    lines = (admin_commands if fmt == "admin" else rest_calls)(wanted, host_role, agent_role)
    if as_json:
        permissions = [{"namespace": name, "role": role, "actions": list(actions)}
                       for name, role, actions in grants(wanted, host_role, agent_role)]
        click.echo(json.dumps({"tenants": wanted.tenants, "namespaces": wanted.namespaces, "permissions": permissions,
                               "namespace": wanted.namespace, "format": fmt, "lines": lines}, indent=2))
        return
    click.echo("\n".join(lines))
