#include "textflag.h"

// func fillWords(p *uint64, n int, v, step uint64)
//
// Word k of p[0:n] = v + k*step, written with non-temporal stores
// (MOVNTI): a line is written without first being read for ownership,
// and the pattern does not evict what the copies beside it have cached.
// SFENCE orders the stores before the caller's next (a fence's Fire).
TEXT ·fillWords(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ v+16(FP), AX
	MOVQ step+24(FP), BX
	TESTQ CX, CX
	JLE done

loop:
	MOVNTIQ AX, (DI)
	ADDQ BX, AX
	ADDQ $8, DI
	DECQ CX
	JNE loop

done:
	SFENCE
	RET
