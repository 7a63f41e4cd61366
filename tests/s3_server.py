"""moto's S3 server for the tests, serving one request at a time: `python tests/s3_server.py HOST PORT`.

Why not `python -m moto.server`: that serves each request in a thread of its own, and moto's conditional put
(If-None-Match: *, which `reserve_version` claims a checkpoint version with) checks that the key is absent and then
writes it, without a lock between the two; two claims that race can both be told they won, which no real bucket
does. Under load, 3 rounds in 60 of eight concurrent claims handed one version out twice this way (and failed
test_concurrent_updates_reserve_distinct_checkpoint_versions in CI); served one at a time, none in 60. The app and
its request handler are moto's own; only werkzeug's `threaded` differs (without it werkzeug also speaks HTTP/1.0,
so a client's idle connection never holds the server)."""

from __future__ import annotations

import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

if __name__ == "__main__":
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, app, threaded=False, request_handler=MotoRequestHandler)
