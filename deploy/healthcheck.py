"""Container health check: `python healthcheck.py [HOST:PORT] [SERVICE]` exits 0 when SERVING.

Asks the server's grpc.health.v1.Health/Check (the empty service name = the whole
server, NOT_SERVING while it drains after SIGTERM). Only grpcio and grpcio-health-checking,
both project dependencies, so the image needs no grpcurl or curl. The address defaults to
127.0.0.1 and the port to $GRPC_PORT.
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else f"127.0.0.1:{os.environ['GRPC_PORT']}"
    service = sys.argv[2] if len(sys.argv) > 2 else ""
    try:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2.0
            )
    except grpc.RpcError as err:
        print(f"{target}: {err.code().name}", file=sys.stderr)
        return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    raise SystemExit(main())
