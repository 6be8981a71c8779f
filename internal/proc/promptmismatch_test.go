package proc

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestPromptMismatchNamedByBothRoles: the two roles given different
// --seed, so that their first request's prompt lengths differ. The
// context side's engine fails the request with an error matching
// kvxfer.ErrPromptMismatch; the generation side learns of it from the
// context side's FAILED Result, its error matching it too. Each role
// decides by errors.Is (no longer by words of the engine's text) and
// names the two request lists in its report. (Checked to fail: without
// RxSession's ErrPromptMismatch tag the generation role named nothing;
// with outcomeErr's former %v, which dropped the engine's error from the
// chain, the context role named nothing.)
func TestPromptMismatchNamedByBothRoles(t *testing.T) {
	ctxO, genO := pairOptions(t, 1)
	genO.Seed = 2
	if c, g := Prompts(ctxO)[0], Prompts(genO)[0]; c == g {
		t.Fatalf("seeds 1 and 2 give %s the same length %d: pick others", RequestID(0), c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*reportDeadline)
	defer cancel()
	var genRep Report
	genDone := make(chan struct{})
	go func() {
		defer close(genDone)
		genRep, _ = RunGen(ctx, genO, io.Discard)
	}()
	ctxRep, _ := RunCtx(ctx, ctxO, io.Discard)
	<-genDone
	if want := "another length in the generation process"; !strings.Contains(ctxRep.SettingsMismatch, want) {
		t.Errorf("ctx names %q, want %q", ctxRep.SettingsMismatch, want)
	}
	if want := "another length in the context process"; !strings.Contains(genRep.SettingsMismatch, want) {
		t.Errorf("gen names %q, want %q", genRep.SettingsMismatch, want)
	}
}
