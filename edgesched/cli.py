"""The edgesched command line (typer). Placeholder until the CLI lands."""


def main() -> None:
    raise SystemExit(0)
