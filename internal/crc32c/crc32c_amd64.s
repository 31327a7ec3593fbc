#include "textflag.h"

// The folding kernels (package doc): four registers of 16-byte lanes,
// loaded from the first window and each folded one window forward onto
// the next window's bytes; then each register folded onto the next, the
// last register's lanes onto its last lane, and that block's CRC taken
// with two CRC32Q from state 0. keys: the window pair, the register pair,
// then one pair per lane (shape.keys).

// YREDUCE folds Y0–Y3 onto Y3's last lane and returns that block's CRC
// (keys at BX: the register pair at 16, the lane pairs at 32).
#define YREDUCE \
	VBROADCASTI128 16(BX), Y8 \
	VPCLMULQDQ $0x00, Y8, Y0, Y4 \
	VPCLMULQDQ $0x11, Y8, Y0, Y5 \
	VPXOR      Y4, Y1, Y1 \
	VPXOR      Y5, Y1, Y1 \
	VPCLMULQDQ $0x00, Y8, Y1, Y4 \
	VPCLMULQDQ $0x11, Y8, Y1, Y5 \
	VPXOR      Y4, Y2, Y2 \
	VPXOR      Y5, Y2, Y2 \
	VPCLMULQDQ $0x00, Y8, Y2, Y4 \
	VPCLMULQDQ $0x11, Y8, Y2, Y5 \
	VPXOR      Y4, Y3, Y3 \
	VPXOR      Y5, Y3, Y3 \
	VMOVDQU    32(BX), Y8 \
	VPCLMULQDQ $0x00, Y8, Y3, Y4 \
	VPCLMULQDQ $0x11, Y8, Y3, Y5 \
	VPXOR      Y5, Y4, Y4 \
	VEXTRACTI128 $1, Y3, X7 \
	VPXOR      X7, X4, X4 \
	VMOVQ      X4, AX \
	VPEXTRQ    $1, X4, DX \
	XORL       CX, CX \
	CRC32Q     AX, CX \
	CRC32Q     DX, CX \
	VZEROUPPER \
	MOVL       CX, ret+32(FP) \
	RET

// func foldZ(crc uint32, p *byte, n int, keys *foldKey) uint32
TEXT ·foldZ(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ keys+24(FP), BX
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVQ AX, X4
	VPXORQ Z4, Z0, Z0
	VBROADCASTI32X4 0(BX), Z8
	ADDQ $256, SI
	SUBQ $256, CX
	JZ   zreduce

zloop:
	VPCLMULQDQ $0x00, Z8, Z0, Z4
	VPCLMULQDQ $0x11, Z8, Z0, Z0
	VPTERNLOGQ $0x96, 0(SI), Z4, Z0
	VPCLMULQDQ $0x00, Z8, Z1, Z5
	VPCLMULQDQ $0x11, Z8, Z1, Z1
	VPTERNLOGQ $0x96, 64(SI), Z5, Z1
	VPCLMULQDQ $0x00, Z8, Z2, Z6
	VPCLMULQDQ $0x11, Z8, Z2, Z2
	VPTERNLOGQ $0x96, 128(SI), Z6, Z2
	VPCLMULQDQ $0x00, Z8, Z3, Z7
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGQ $0x96, 192(SI), Z7, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JNZ  zloop

zreduce:
	VBROADCASTI32X4 16(BX), Z8
	VPCLMULQDQ $0x00, Z8, Z0, Z4
	VPCLMULQDQ $0x11, Z8, Z0, Z5
	VPTERNLOGQ $0x96, Z5, Z4, Z1
	VPCLMULQDQ $0x00, Z8, Z1, Z4
	VPCLMULQDQ $0x11, Z8, Z1, Z5
	VPTERNLOGQ $0x96, Z5, Z4, Z2
	VPCLMULQDQ $0x00, Z8, Z2, Z4
	VPCLMULQDQ $0x11, Z8, Z2, Z5
	VPTERNLOGQ $0x96, Z5, Z4, Z3
	VMOVDQU64  32(BX), Z8
	VPCLMULQDQ $0x00, Z8, Z3, Z4
	VPCLMULQDQ $0x11, Z8, Z3, Z5
	VPXORQ     Z5, Z4, Z4
	VEXTRACTI32X4 $1, Z4, X5
	VEXTRACTI32X4 $2, Z4, X6
	VEXTRACTI32X4 $3, Z3, X7
	VPXOR      X5, X4, X4
	VPXOR      X7, X6, X6
	VPXOR      X6, X4, X4
	VMOVQ      X4, AX
	VPEXTRQ    $1, X4, DX
	XORL       CX, CX
	CRC32Q     AX, CX
	CRC32Q     DX, CX
	VZEROUPPER
	MOVL       CX, ret+32(FP)
	RET

// func foldY(crc uint32, p *byte, n int, keys *foldKey) uint32
TEXT ·foldY(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ keys+24(FP), BX
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVQ   AX, X4
	VPXOR   Y4, Y0, Y0
	VBROADCASTI128 0(BX), Y8
	ADDQ    $128, SI
	SUBQ    $128, CX
	JZ      yreduce

yloop:
	VPCLMULQDQ $0x00, Y8, Y0, Y4
	VPCLMULQDQ $0x11, Y8, Y0, Y0
	VPXOR      0(SI), Y4, Y4
	VPXOR      Y4, Y0, Y0
	VPCLMULQDQ $0x00, Y8, Y1, Y5
	VPCLMULQDQ $0x11, Y8, Y1, Y1
	VPXOR      32(SI), Y5, Y5
	VPXOR      Y5, Y1, Y1
	VPCLMULQDQ $0x00, Y8, Y2, Y6
	VPCLMULQDQ $0x11, Y8, Y2, Y2
	VPXOR      64(SI), Y6, Y6
	VPXOR      Y6, Y2, Y2
	VPCLMULQDQ $0x00, Y8, Y3, Y7
	VPCLMULQDQ $0x11, Y8, Y3, Y3
	VPXOR      96(SI), Y7, Y7
	VPXOR      Y7, Y3, Y3
	ADDQ       $128, SI
	SUBQ       $128, CX
	JNZ        yloop

yreduce:
	YREDUCE

// func foldH(crc uint32, p *byte, n int, keys *foldKey) uint32
// The hybrid kernel (hybrid.go) over n bytes of whole 8-KiB blocks: per
// pass of hloop one quadword of each of the four 1-KiB streams (R8–R11)
// beside each quarter of one 128-byte window's fold. keys: ymm's four
// pairs, the jump pair at 64, the streams' pairs at 80, 96, 112, 128.
TEXT ·foldH(SB), NOSPLIT, $0-36
	MOVL  crc+0(FP), R8
	MOVQ  p+8(FP), SI
	MOVQ  n+16(FP), CX
	MOVQ  keys+24(FP), BX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3

hblock:
	XORL R9, R9
	XORL R10, R10
	XORL R11, R11
	LEAQ 4096(SI), DI
	XORL DX, DX
	VBROADCASTI128 64(BX), Y8

hloop:
	CRC32Q     0(SI)(DX*1), R8
	CRC32Q     1024(SI)(DX*1), R9
	CRC32Q     2048(SI)(DX*1), R10
	CRC32Q     3072(SI)(DX*1), R11
	VPCLMULQDQ $0x00, Y8, Y0, Y4
	VPCLMULQDQ $0x11, Y8, Y0, Y0
	VPXOR      0(DI), Y4, Y4
	VPXOR      Y4, Y0, Y0
	CRC32Q     8(SI)(DX*1), R8
	CRC32Q     1032(SI)(DX*1), R9
	CRC32Q     2056(SI)(DX*1), R10
	CRC32Q     3080(SI)(DX*1), R11
	VPCLMULQDQ $0x00, Y8, Y1, Y5
	VPCLMULQDQ $0x11, Y8, Y1, Y1
	VPXOR      32(DI), Y5, Y5
	VPXOR      Y5, Y1, Y1
	CRC32Q     16(SI)(DX*1), R8
	CRC32Q     1040(SI)(DX*1), R9
	CRC32Q     2064(SI)(DX*1), R10
	CRC32Q     3088(SI)(DX*1), R11
	VPCLMULQDQ $0x00, Y8, Y2, Y6
	VPCLMULQDQ $0x11, Y8, Y2, Y2
	VPXOR      64(DI), Y6, Y6
	VPXOR      Y6, Y2, Y2
	CRC32Q     24(SI)(DX*1), R8
	CRC32Q     1048(SI)(DX*1), R9
	CRC32Q     2072(SI)(DX*1), R10
	CRC32Q     3096(SI)(DX*1), R11
	VPCLMULQDQ $0x00, Y8, Y3, Y7
	VPCLMULQDQ $0x11, Y8, Y3, Y3
	VPXOR      96(DI), Y7, Y7
	VPXOR      Y7, Y3, Y3
	VBROADCASTI128 0(BX), Y8
	ADDQ       $128, DI
	ADDQ       $32, DX
	CMPQ       DX, $1024
	JNE        hloop

	VMOVQ      R8, X9
	VPCLMULQDQ $0x00, 80(BX), X9, X9
	VMOVQ      R9, X10
	VPCLMULQDQ $0x00, 96(BX), X10, X10
	VPXOR      X10, X9, X9
	VMOVQ      R10, X10
	VPCLMULQDQ $0x00, 112(BX), X10, X10
	VPXOR      X10, X9, X9
	VMOVQ      R11, X10
	VPCLMULQDQ $0x00, 128(BX), X10, X10
	VPXOR      X10, X9, X9
	VPXOR      Y9, Y0, Y0
	XORL       R8, R8
	ADDQ       $8192, SI
	SUBQ       $8192, CX
	JNZ        hblock
	YREDUCE

// func cpuid7ecx() uint32
TEXT ·cpuid7ecx(SB), NOSPLIT, $0-4
	MOVL $7, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET
