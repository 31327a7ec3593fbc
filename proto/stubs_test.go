package proto

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// TestCommittedStubsMatchTheProtos: the generated Go code describes the
// messages the .proto files define now (a field added without `make proto`
// fails here). It compares protoc's descriptors with the ones compiled into
// package orbitkvv1; it needs protoc (scripts/install-deps.sh) and skips
// without it, saying so.
func TestCommittedStubsMatchTheProtos(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("protoc is not installed (scripts/install-deps.sh installs it)")
	}
	files := map[string]protoreflect.FileDescriptor{
		"orbitkv/v1/engine.proto": pb.File_orbitkv_v1_engine_proto,
		"orbitkv/v1/admin.proto":  pb.File_orbitkv_v1_admin_proto,
		"orbitkv/v1/peer.proto":   pb.File_orbitkv_v1_peer_proto,
	}
	out := filepath.Join(t.TempDir(), "set.pb")
	args := []string{"-I", ".", "--descriptor_set_out=" + out}
	for name := range files {
		args = append(args, name)
	}
	if b, err := exec.Command("protoc", args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.File) != len(files) {
		t.Fatalf("protoc described %d files, want %d", len(set.File), len(files))
	}
	for _, want := range set.File {
		got := protodesc.ToFileDescriptorProto(files[want.GetName()])
		if !proto.Equal(withoutJSONNames(got), withoutJSONNames(want)) {
			t.Errorf("%s: the generated Go code is stale; run make proto", want.GetName())
		}
	}
}

// withoutJSONNames clears json_name, which protoc's descriptor sets carry
// and compiled-in descriptors may not.
func withoutJSONNames(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
	var strip func([]*descriptorpb.DescriptorProto)
	strip = func(msgs []*descriptorpb.DescriptorProto) {
		for _, m := range msgs {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			strip(m.NestedType)
		}
	}
	strip(fd.MessageType)
	return fd
}
