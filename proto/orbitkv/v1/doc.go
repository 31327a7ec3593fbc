// Package orbitkvv1 is the generated code of the orbitkv.v1 engine and admin
// services (engine.proto, admin.proto). Regenerate with `make proto`.
package orbitkvv1
