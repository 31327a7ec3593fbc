from orbitkv._proto import admin_pb2, admin_pb2_grpc, engine_pb2, engine_pb2_grpc


def test_stubs_import_and_roundtrip():
    req = engine_pb2.LoadRequest(session_id="s", pages=[engine_pb2.PageRef(key=b"k" * 16, blocks=[1, 2])])
    back = engine_pb2.LoadRequest.FromString(req.SerializeToString())
    assert back.pages[0].blocks == [1, 2]
    assert admin_pb2.StatusResponse(tiers=[admin_pb2.TierStatus(tier=engine_pb2.TIER_SSD)]).tiers[0].tier == 2
    assert hasattr(engine_pb2_grpc, "EngineServiceStub") and hasattr(admin_pb2_grpc, "AdminServiceStub")
    assert engine_pb2.DESCRIPTOR.name == "orbitkv/v1/engine.proto"
