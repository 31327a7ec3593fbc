// Package proto holds the OrbitKV .proto files and their generated Go code
// (package orbitkvv1). Regenerate with `make proto`; the generated files are
// committed so that a build needs no protoc.
package proto

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative orbitkv/v1/engine.proto orbitkv/v1/admin.proto orbitkv/v1/peer.proto
