//go:build !amd64

package crc32c

var kernel = struct{ name string }{"sse4.2"}

func foldable(int) int { return 0 }

func foldAsm(uint32, []byte) uint32 { panic("crc32c: no vector kernel here") }
