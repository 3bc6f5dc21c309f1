"""Server reflection that also resolves method names (`grpcurl describe Service.Method`).

grpcio-reflection asks the descriptor pool for the file containing a symbol; with the
upb protobuf runtime the pool does not index methods, so describing a method answers
NOT_FOUND (grpc/grpc#34743). This servicer falls back to the method's service.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection_pb2_grpc
from grpc_reflection.v1alpha._base import _file_descriptor_response


class MethodAwareReflectionServicer(reflection_aio.ReflectionServicer):  # type: ignore[misc]
    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        response = super()._file_containing_symbol(request, fully_qualified_name)
        if not response.HasField("error_response"):
            return response
        service_name, _, method = fully_qualified_name.rpartition(".")
        pool = self._pool or descriptor_pool.Default()
        try:
            service = pool.FindServiceByName(service_name)
        except KeyError:
            return response
        if method not in service.methods_by_name:
            return response
        return _file_descriptor_response(service.file, request)


def enable_reflection(service_names: tuple[str, ...], server: Any) -> None:
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        MethodAwareReflectionServicer(service_names), server
    )
