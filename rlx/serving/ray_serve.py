"""`rlxc serve --ray --replicas N`: N engine replicas behind one HTTP endpoint, through Ray Serve.

Each replica is a Ray Serve deployment replica that builds the same app `rlxc serve` serves alone
(`build`, `rlx.serving.cli.build_app`: its own model, engine and metrics) when it starts; Ray Serve's proxy takes
the requests on `--host:--port` and routes each to a replica (Ray's router, not one of ours), streams
included. Every response names the replica that served it in an `x-rlx-replica` header. Ray (the
`ray` extra: `pip install 'rlx[ray]'`) is imported only here, when the replicas start; on one machine a
local Ray starts with them, elsewhere `--ray-address` names the cluster.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from typing import Any

#: The deployment's name, and the Serve application's.
APP_NAME = "rlx"
REPLICA_HEADER = "x-rlx-replica"
INSTALL_HINT = "rlxc serve --ray needs Ray Serve: pip install 'rlx[ray]'"


def replicas_app(args: argparse.Namespace, build: Callable[[argparse.Namespace], Any], replicas: int,
                 replica_cpus: float) -> Any:
    """The Ray Serve application of `replicas` replicas of the app `build(args)` makes (each reserving
    `replica_cpus` CPUs of the cluster)."""
    from ray import serve

    def replica_app() -> Any:  # run by each replica as it starts
        app = build(args)
        tag = serve.get_replica_context().replica_tag

        @app.middleware("http")
        async def name_the_replica(request: Any, call_next: Any) -> Any:
            response = await call_next(request)
            response.headers[REPLICA_HEADER] = tag
            return response

        return app

    ingress = serve.ingress(replica_app)()
    deployment = serve.deployment(ingress, name=APP_NAME, num_replicas=replicas,
                                  ray_actor_options={"num_cpus": replica_cpus})
    return deployment.bind()


def start_replicas(args: argparse.Namespace, build: Callable[[argparse.Namespace], Any]) -> str:
    """Start (or join, `--ray-address`) Ray, then Serve's proxy on `args.host:args.port` and the replicas of the
    app `build(args)` makes; returns the endpoint's URL once every replica is up. `stop_replicas` ends them."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=args.ray_address, include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(replicas_app(args, build, args.replicas, args.replica_cpus), name=APP_NAME, route_prefix="/")
    return f"http://{args.host}:{args.port}"


def stop_replicas() -> None:
    """Shut Serve down: the proxy and the replicas (each replica's engine drains as its app shuts down)."""
    from ray import serve

    serve.shutdown()


def run(args: argparse.Namespace, build: Callable[[argparse.Namespace], Any]) -> None:
    """Serve until SIGINT/SIGTERM, then stop the replicas and leave Ray."""
    import ray

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = start_replicas(args, build)
    print(f"rlxc serve: {args.replicas} replicas at {url} (Ray Serve)", flush=True)
    try:
        stop.wait()
    finally:
        stop_replicas()
        ray.shutdown()
