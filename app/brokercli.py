"""The join flow's commands (issue 18): ``broker init``, ``broker check``, ``central
add-node``, ``central remove-node``, ``central join-server`` and ``join``, registered on
the ``edgesched`` app by :func:`register`. Each failure is one ``error:`` line on stderr
(exit 2 for bad input, 1 for a check or a wait that failed), never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

#: edgesched.brokerinit.DEFAULT_DIR (not imported here: the CLI starts without cryptography)
DEFAULT_DIR = Path("/etc/edgesched/broker")

BrokerDirOption = Annotated[
    Path, typer.Option("--dir", help="The broker directory (broker init made it).")
]


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def register(app: typer.Typer, central_app: typer.Typer) -> None:
    broker_app = typer.Typer(
        help="The fleet's Mosquitto: write its configuration, check a node's access.",
        no_args_is_help=True,
    )
    app.add_typer(broker_app, name="broker")

    @broker_app.command("init")
    def broker_init(
        directory: Annotated[
            Path, typer.Option("--dir", help="The broker directory to write.")
        ] = DEFAULT_DIR,
        address: Annotated[
            str | None,
            typer.Option(help="HOST[:PORT] the nodes dial (default: this host's name, 8883)."),
        ] = None,
        port: Annotated[
            int | None, typer.Option(help="The listener's port (default: the address's).")
        ] = None,
        bind: Annotated[str, typer.Option(help="The listener's address.")] = "0.0.0.0",
        name: Annotated[
            list[str] | None,
            typer.Option("--name", help="Another name or IP for the broker's certificate."),
        ] = None,
        central_id: Annotated[
            list[str] | None, typer.Option("--central-id", help="Central ids (default central).")
        ] = None,
        ca_dir: Annotated[
            Path | None,
            typer.Option(help="The fleet CA (ca.crt, ca.key) to use; default: made in DIR/ca."),
        ] = None,
        site: Annotated[
            str | None, typer.Option(help="Make a site broker, bridged to central's.")
        ] = None,
        central_broker: Annotated[
            str | None, typer.Option(help="HOST:PORT of central's broker (with --site).")
        ] = None,
        central_dir: Annotated[
            Path | None,
            typer.Option(help="Central's broker directory: register the site there."),
        ] = None,
        user: Annotated[
            str | None, typer.Option(help="The account Mosquitto runs as (default mosquitto).")
        ] = None,
        force: Annotated[bool, typer.Option(help="Remake the files of an existing one.")] = False,
    ) -> None:
        """Write a complete Mosquitto for the fleet (TLS, certificate identities, ACL, CRL,
        persistence; a site's bridge), and a systemd unit for it."""
        from edgesched.brokerinit import BrokerDirError, InitOptions, init_broker, start_command

        opts = InitOptions(
            directory, address, port, bind, tuple(name or ()),
            tuple(central_id or ("central",)), ca_dir, site, central_broker, central_dir,
            user, force,
        )  # fmt: skip
        try:
            bd, done = init_broker(opts)
        except BrokerDirError as exc:
            _fail(str(exc))
        for line in done:
            typer.echo(line)
        typer.echo(f"run it: {' '.join(start_command(bd))}")
        typer.echo(
            f"or under systemd: cp {bd.unit} /etc/systemd/system/ && systemctl daemon-reload "
            f"&& systemctl enable --now {bd.unit.name}"
        )
        if site is None:
            typer.echo(f"then admit a node: edgesched central add-node NODE --dir {directory}")

    @broker_app.command("check")
    def broker_check(
        broker: Annotated[str, typer.Option(help="HOST[:PORT] of the broker (8883).")],
        node_id: Annotated[str, typer.Option("--node-id", help="The node to connect as.")],
        ca: Annotated[Path, typer.Option(help="The fleet CA certificate.")],
        cert: Annotated[Path, typer.Option(help="The node's certificate.")],
        key: Annotated[Path, typer.Option(help="Its private key.")],
        timeout: Annotated[float, typer.Option(help="Seconds per step.")] = 5.0,
    ) -> None:
        """Connect as the node would and report DNS, TCP, TLS, auth and ACL, one line each
        (it takes over the node's session: run it while the node is stopped)."""
        from edgesched.brokercheck import Target, check
        from edgesched.brokerinit import BrokerDirError, split_address

        try:
            host, port = split_address(broker)
        except BrokerDirError as exc:
            _fail(f"--broker: {exc}")
        for what, path in (("--ca", ca), ("--cert", cert), ("--key", key)):
            if not path.is_file():
                _fail(f"{what} {path}: no such file")
        result = check(
            Target(host, port, node_id, str(ca), str(cert), str(key)), timeout, say=typer.echo
        )
        if not result.ok:
            raise typer.Exit(1)

    @central_app.command("add-node")
    def central_add_node(
        node_id: Annotated[str, typer.Argument(help="The new node's id.")],
        site: Annotated[str | None, typer.Option(help="Its site (a site broker).")] = None,
        directory: BrokerDirOption = DEFAULT_DIR,
        ttl: Annotated[
            str, typer.Option(help="How long the join token is good for (30m, 1h, 2d).")
        ] = "1h",
        url: Annotated[
            str | None,
            typer.Option(help="The join server's URL (default https://BROKER-HOST:8884)."),
        ] = None,
        file: Annotated[
            bool,
            typer.Option(
                "--file", help="Write a join file holding the node's key instead (offline)."
            ),
        ] = False,
        force: Annotated[bool, typer.Option(help="Issue an admitted node anew.")] = False,
    ) -> None:
        """Admit a node: print the `edgesched join URL TOKEN` line to run on the gateway (a
        one-time token for the join server), or with --file write a join file."""
        from edgesched.brokerinit import BrokerDirError
        from edgesched.jointoken import TokenError, parse_ttl
        from edgesched.nodeaccess import add_node, invite

        if file:
            try:
                admission = add_node(directory, node_id, site, force=force)
            except BrokerDirError as exc:
                _fail(str(exc))
            for line in admission.done:
                typer.echo(line, err=True)
            typer.echo(f"copy {admission.join_file} to the gateway, then run there:", err=True)
            typer.echo(admission.join_line())
            return
        if url is not None and not url.startswith("https://"):
            _fail(f"--url: must be https://HOST[:PORT], got {url!r}")
        try:
            invitation = invite(
                directory, node_id, site, ttl_s=parse_ttl(ttl), url=url, force=force
            )
        except (BrokerDirError, TokenError) as exc:
            _fail(str(exc))
        for line in invitation.done:
            typer.echo(line, err=True)
        typer.echo(
            f"with `edgesched central join-server --dir {directory}` running, run on the "
            "gateway (once):",
            err=True,
        )
        typer.echo(invitation.join_line())

    @central_app.command("join-server")
    def central_join_server(
        directory: BrokerDirOption = DEFAULT_DIR,
        listen: Annotated[
            str, typer.Option(help="HOST:PORT to serve HTTPS on (the join URL's port).")
        ] = "0.0.0.0:8884",
        refusals_per_minute: Annotated[
            int,
            typer.Option(
                min=1, help="Refused tokens an address may send a minute before it gets 429."
            ),
        ] = 10,
    ) -> None:
        """Serve joins by URL: gateways spend their one-time tokens here for a certificate
        (HTTPS with the broker's certificate; GET /join/ca, POST /join)."""
        import asyncio
        import logging

        from edgesched.brokerinit import BrokerDirError, split_address
        from edgesched.joinserver import serve

        try:
            host, port = split_address(listen, 8884)
        except BrokerDirError as exc:
            _fail(f"--listen: {exc}")
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        try:
            asyncio.run(serve(directory, host, port, refusals_per_minute=refusals_per_minute))
        except BrokerDirError as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail(f"--listen {listen}: {exc.strerror or exc}", 1)
        except KeyboardInterrupt:
            pass

    @central_app.command("remove-node")
    def central_remove_node(
        node_id: Annotated[str, typer.Argument(help="The node to revoke.")],
        directory: BrokerDirOption = DEFAULT_DIR,
    ) -> None:
        """Revoke a node: out of the ACL, its certificate in the CRL, Mosquitto reloaded."""
        from edgesched.brokerinit import BrokerDirError
        from edgesched.nodeaccess import remove_node

        try:
            done = remove_node(directory, node_id)
        except BrokerDirError as exc:
            _fail(str(exc))
        for line in done:
            typer.echo(line)

    @app.command("join")
    def join_command(
        source: Annotated[
            Path,
            typer.Argument(
                help="The join server's URL (https://HOST:PORT) or a join file (--file)."
            ),
        ],
        token: Annotated[
            str | None,
            typer.Argument(help="The token printed beside it (a URL's is one-time)."),
        ] = None,
        user: Annotated[
            str | None, typer.Option(help="Run as this existing user (default: edgesched).")
        ] = None,
        release: Annotated[
            Path | None, typer.Option(help="The release `current` points at (a venv).")
        ] = None,
        start: Annotated[bool, typer.Option(help="Enable and (re)start the service.")] = True,
        check: Annotated[bool, typer.Option(help="Check the broker before installing.")] = True,
        wait: Annotated[
            float, typer.Option(help="Seconds to wait for the node to connect (0: don't).")
        ] = 90.0,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                help="Where the node you start by hand keeps its state (default: the unit's)."
            ),
        ] = None,
        prefix: Annotated[Path, typer.Option(help="Releases and `current`.")] = Path(
            "/opt/edgesched"
        ),
        etc_dir: Annotated[Path, typer.Option(help="Config and certificates.")] = Path(
            "/etc/edgesched"
        ),
        unit_dir: Annotated[Path, typer.Option(help="Where the systemd unit goes.")] = Path(
            "/etc/systemd/system"
        ),
        root: Annotated[
            Path, typer.Option(help="Stage every path under this directory (like DESTDIR).")
        ] = Path("/"),
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Check and print the install; write nothing.")
        ] = False,
    ) -> None:
        """Join this gateway to the fleet: get its certificate from the join server (its key
        made here), check the broker, install the node, wait until it is connected (or say
        exactly what failed)."""
        from edgesched.install import InstallError, Layout
        from edgesched.join import JoinError, JoinOptions, join

        try:
            layout = Layout("edge", prefix, etc_dir, unit_dir, root)
        except InstallError as exc:
            _fail(str(exc))
        opts = JoinOptions(
            source, layout, token, user, release, start, check, wait, state_dir, dry_run
        )
        try:
            join(opts, say=typer.echo)
        except JoinError as exc:
            _fail(str(exc), 1)
