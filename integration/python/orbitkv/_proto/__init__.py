"""Generated gRPC stubs for proto/orbitkv/v1 (regenerate with ../../gen_proto.sh).

The message modules are protoc 3.21 output (the ``_builder`` form), which
imports with protobuf 4.21 and with the 5.x/6.x runtimes; the service modules
use only ``channel.unary_unary``, which every grpcio release provides.
"""
