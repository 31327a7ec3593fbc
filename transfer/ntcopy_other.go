//go:build !amd64

package transfer

func copyLarge(dst, src []byte) { copy(dst, src) }
