"""The Open Inference Protocol over gRPC: `server.GrpcFront` (each worker's server), `service` (the RPCs),
`tensors` (messages to arrays and back), `bridge` (the RPCs REST's views answer), `health` (grpc.health.v1),
`port` (the master's check), `oip.proto` and its generated `oip_pb2` (`generate` remakes it).
"""
