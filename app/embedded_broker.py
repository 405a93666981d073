"""An MQTT 3.1.1 broker in pure Python (amqtt), for machines without Mosquitto.

``python -m edgesched.embedded_broker --port N`` listens on 127.0.0.1:N with anonymous access
until SIGTERM or SIGINT. It exists so ``edgesched demo`` runs with nothing else installed;
it speaks MQTT 3.1.1 only (peers then use ``protocol = "3.1.1"``) and keeps its sessions in
memory. Fleets use Mosquitto.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from amqtt.broker import Broker


def broker_config(port: int) -> dict[str, object]:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def serve(port: int) -> None:
    broker = Broker(broker_config(port))
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await broker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
