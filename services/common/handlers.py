"""A gRPC method handler with its behaviour wrapped: what every server interceptor of the
mesh returns for the service's own unary and server-streaming methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def wrapped(
    handler: grpc.RpcMethodHandler,
    unary: Wrap,
    stream: Wrap,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """`handler` with a unary-unary behaviour passed through `unary`, a unary-stream one
    through `stream` (and its request read by `request_deserializer` when given); a handler
    of another kind unchanged."""
    deserializer = request_deserializer or handler.request_deserializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            unary(handler.unary_unary),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            stream(handler.unary_stream),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler
