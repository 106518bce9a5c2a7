"""``python -m simulator``: run the Evolution API simulator until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import resource
import signal
import sys

from aiohttp import web

from . import banmodel, collector
from .app import load_preload, make_app
from .config import DEFAULT_API_KEY, DEFAULT_EXCHANGE, GlobalConfig, env_first
from .keys import WORLD


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m simulator", description="Evolution API v2 simulator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(env_first("SIMULATOR_PORT", default="8081") or 8081),
                   help="0 picks a free port (printed in the ready line)")
    p.add_argument("--api-key", default=env_first("SIMULATOR_API_KEY", "EVOLUTION_API_KEY", default=DEFAULT_API_KEY))
    p.add_argument("--rabbitmq-url", default=env_first("SIMULATOR_RABBITMQ_URL", "EVOLUTION_RABBITMQ_URL"),
                   help="amqp://...; unset = RabbitMQ off")
    p.add_argument("--exchange", default=env_first("SIMULATOR_EXCHANGE", "EVOLUTION_RABBITMQ_EXCHANGE",
                                                   default=DEFAULT_EXCHANGE))
    p.add_argument("--prefix", default=env_first("SIMULATOR_RABBITMQ_PREFIX", default=""),
                   help="RABBITMQ_PREFIX_KEY: global queues are named <prefix>.<event>")
    p.add_argument("--rabbitmq-global", action=argparse.BooleanOptionalAction, default=True,
                   help="publish every event on --exchange (default on when a URL is given)")
    p.add_argument("--declare-queues", action=argparse.BooleanOptionalAction, default=True,
                   help="assert Evolution's quorum queues per event, like Evolution does")
    p.add_argument("--global-webhook-url", default=env_first("SIMULATOR_GLOBAL_WEBHOOK_URL"))
    p.add_argument("--global-by-events", action="store_true", help="append /<kebab-event> to the global URL")
    p.add_argument("--preload", help="JSON file: a list of instance configs (control-API shape plus 'name')")
    p.add_argument("--server-url", help="value of server_url in events (default http://HOST:PORT)")
    p.add_argument("--log-level", default=env_first("SIMULATOR_LOG_LEVEL", default="WARNING"))
    p.add_argument("--ban-model", action=argparse.BooleanOptionalAction,
                   default=env_first("SIMULATOR_BAN_MODEL", default="") in ("1", "true", "yes", "on"),
                   help="judge every Baileys number by the ban model (off by default; see simulator/README.md)")
    p.add_argument("--time-scale", type=float, default=float(env_first("SIMULATOR_TIME_SCALE", default="1") or 1),
                   help="model seconds per real second for the ban model's durations (1000: a week in ~10 min)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    ban_model = copy.deepcopy(banmodel.DEFAULTS)
    ban_model["enabled"] = args.ban_model
    cfg = GlobalConfig(
        api_key=args.api_key,
        webhook_url=args.global_webhook_url,
        by_events=args.global_by_events,
        rabbitmq_url=args.rabbitmq_url,
        rabbitmq_global=bool(args.rabbitmq_url) and args.rabbitmq_global,
        exchange=args.exchange,
        prefix=args.prefix,
        declare_queues=args.declare_queues,
        ban_model=ban_model,
        time_scale=banmodel.check_time_scale(args.time_scale),
    )
    app = make_app(cfg, load_preload(args.preload))
    # Short grace period: a hung request (hang_ms) must not hold up shutdown.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else args.port
    cfg.server_url = args.server_url or f"http://{args.host}:{port}"
    app[WORLD].startup_cfg.server_url = cfg.server_url  # keep it across reset {"global": true}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    collector.settle()
    collecting = loop.create_task(collector.collect_every())
    print(f"simulator listening on http://{args.host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        collecting.cancel()
        await runner.cleanup()


def raise_open_files_limit() -> None:
    """Every pending webhook holds its own socket (simulator/webhooks.py: no limit, as Evolution's
    Node agent): a receipt storm needs thousands, more than a soft limit of 1,024 allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    wanted = max(soft, 65536) if hard == resource.RLIM_INFINITY else hard
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger("simulator").warning("open files limit stays %s: %s", soft, exc)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level > logging.DEBUG:
        # aiormq logs every broker outage with tracebacks; simulator.rabbitmq reports them once.
        for name in ("aiormq", "aio_pika"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    raise_open_files_limit()
    try:
        asyncio.run(serve(args))
    except (ValueError, OSError) as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
