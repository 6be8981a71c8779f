package twoproc

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/proc"
)

// Process-level regressions of "READY means the bytes asked for": what a
// user gets from `kvxfer ctx` and `kvxfer gen` started with mismatched
// workloads, or with no context process at all. Before the fix, mismatched
// seeds reported "ok" on both sides with unwritten READY blocks, and a gen
// with no ctx ended after minutes with most of its pool leaked.

// bothLengths matches a failure that names both prompt lengths.
var bothLengths = regexp.MustCompile(`planned a prompt of \d+ tokens, Send has \d+ tokens`)

// TestMismatchedWorkloadsFailNamingBothLengths: the two processes derive
// their prompts from different seeds (or different --max-tokens): every
// request whose lengths differ fails on both sides with a reason naming
// both lengths; whatever ends READY is verified byte for byte; nothing
// leaks; gen names the cause, different request lists, and the flags.
func TestMismatchedWorkloadsFailNamingBothLengths(t *testing.T) {
	cases := map[string]func(g proc.Options, c *proc.Options){
		"seed":       func(g proc.Options, c *proc.Options) { c.Seed = g.Seed + 1 },
		"max-tokens": func(g proc.Options, c *proc.Options) { c.MaxTokens = g.MaxTokens / 2 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			g, c := options(t, 6, 0)
			mutate(g, &c)
			gen := spawn(t, "gen", g)
			ctx := spawn(t, "ctx", c)
			cr, _ := ctx.wait(t, 2*time.Minute)
			gr, _ := gen.wait(t, 2*time.Minute)
			t.Logf("gen %+v\nctx %+v", gr, cr)
			if gr.Failed == 0 || cr.Failed == 0 {
				t.Fatalf("mismatched workloads, yet nothing failed: gen %+v ctx %+v", gr, cr)
			}
			for side, errs := range map[string][]string{"gen": gr.Errors, "ctx": cr.Errors} {
				for _, e := range errs {
					if !bothLengths.MatchString(e) {
						t.Errorf("%s failure does not name both prompt lengths: %s", side, e)
					}
				}
			}
			if gr.LeakedBlocks != 0 || cr.LeakedBlocks != 0 || gr.Mismatches != 0 || gr.BytesVerified != gr.Bytes {
				t.Fatalf("gen %+v ctx %+v", gr, cr)
			}
			// The run's cause, named for the user (before, only a SUCCESS
			// carried the context side's settings: a run where every
			// request failed did not name them).
			if !strings.Contains(gr.SettingsMismatch, "different request lists") || !strings.Contains(gr.SettingsMismatch, "--seed") {
				t.Errorf("gen does not name the different request lists and the flags to give both: %q", gr.SettingsMismatch)
			}
		})
	}
}

// TestGenWithoutContextExitsAndFrees: `kvxfer gen` with no context process
// and a 5 s timeout names the missing peer and ends within 15 s, every
// request failed, 0 blocks leaked.
func TestGenWithoutContextExitsAndFrees(t *testing.T) {
	g, _ := options(t, 4, 0)
	g.Timeout = 5 * time.Second
	start := time.Now()
	gen := spawn(t, "gen", g)
	gr, _ := gen.wait(t, 15*time.Second)
	t.Logf("gen ended after %v: %+v", time.Since(start).Round(time.Millisecond), gr)
	if gr.Failed != 4 || gr.OK != 0 || gr.LeakedBlocks != 0 {
		t.Fatalf("gen report %+v", gr)
	}
	if !strings.Contains(gr.FirstError, "ctx/0") || !strings.Contains(gr.FirstError, "said nothing") {
		t.Fatalf("the failure does not name the silent peer: %q", gr.FirstError)
	}
}

// TestModelMismatchNamedAtHello: ctx serves Llama-3.1-8B, gen Qwen3-8B,
// gen started first. The generation process names both models as soon as
// the context process's Hello arrives, fails every request with that
// reason instead of waiting for each one's 20 s deadline, and leaks
// nothing (before: found per request, after startup looked healthy). The
// context process names them too, well inside its deadline: the
// generation process leaves only once its own Hello can reach the context
// process (before: ctx waited its 20 s and then blamed a silent peer).
func TestModelMismatchNamedAtHello(t *testing.T) {
	g, c := options(t, 4, 0)
	g.Model = "Qwen3-8B"
	gen := spawn(t, "gen", g)
	// ctx starts once gen listens: gen's connection to ctx then comes up
	// only at its next reconnect, after ctx's Hello reached gen.
	sock := strings.TrimPrefix(g.Bind, "ipc://")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gen never bound %s", g.Bind)
		}
		time.Sleep(time.Millisecond) // polling for the socket file
	}
	ctx := spawn(t, "ctx", c)
	gr, _ := gen.wait(t, 15*time.Second) // well inside the 20 s transfer timeout
	cr, _ := ctx.wait(t, 15*time.Second)
	if gr.Failed != 4 || gr.LeakedBlocks != 0 {
		t.Fatalf("gen report %+v", gr)
	}
	if cr.Failed != 4 || cr.LeakedBlocks != 0 {
		t.Fatalf("ctx report %+v", cr)
	}
	for _, m := range []string{`"Llama-3.1-8B"`, `"Qwen3-8B"`} {
		if !strings.Contains(gr.FirstError, m) {
			t.Fatalf("gen's failure does not name model %s: %q", m, gr.FirstError)
		}
		if !strings.Contains(cr.FirstError, m) {
			t.Fatalf("ctx's failure does not name model %s: %q", m, cr.FirstError)
		}
	}
}

// TestHandshakeMistakesNamedAtStartup: gen is --insecure while ctx uses
// CURVE, or gen holds a wrong public key for ctx. The generation process
// names the failed handshake with ctx/0 (not "transfer deadline passed"),
// fails every request with it well inside the 20 s transfer timeout, and
// leaks nothing.
func TestHandshakeMistakesNamedAtStartup(t *testing.T) {
	cases := map[string]func(g *proc.Options){
		"one side insecure": func(g *proc.Options) { g.Insecure = true },
		"wrong peer key":    func(g *proc.Options) { g.PeerPublicKey = otherKey(t) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			g, c := options(t, 3, 0)
			g.Heartbeat, c.Heartbeat = 500*time.Millisecond, 500*time.Millisecond
			mutate(&g)
			gen := spawn(t, "gen", g)
			ctx := spawn(t, "ctx", c)
			gr, _ := gen.wait(t, 15*time.Second) // well inside the 20 s transfer timeout
			_ = ctx.cmd.Process.Kill()
			_, _ = ctx.wait(t, time.Minute)
			if gr.Failed != 3 || gr.LeakedBlocks != 0 {
				t.Fatalf("gen report %+v", gr)
			}
			if !strings.Contains(gr.FirstError, "handshake") || !strings.Contains(gr.FirstError, "ctx/0") {
				t.Fatalf("the failure does not name the handshake with ctx/0: %q", gr.FirstError)
			}
		})
	}
}

// otherKey is a CURVE public key nobody here holds the secret of.
func otherKey(t *testing.T) string {
	pub, _, err := zmq.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestOwnWrongKeyNamedOnBothSides: ctx runs with a key pair gen does not
// know (a user's --key of another engine), gen as it should. gen names
// the failed handshake at once and exits; ctx, the side with the mistake,
// must name it too (gen refused its key) well inside its 20 s timeout,
// not wait it out and blame a silent peer ("said nothing"). Before, gen
// exited before its refusals reached ctx (a review: ctx failed at its
// deadline). (gen's own key pair given to ctx is refused before ctx
// starts: node's TestOwnPublicKeyAsPeerKeyRefused.)
func TestOwnWrongKeyNamedOnBothSides(t *testing.T) {
	g, c := options(t, 3, 0)
	g.Heartbeat, c.Heartbeat = 500*time.Millisecond, 500*time.Millisecond
	_, sec, err := zmq.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	c.SecretKey = sec
	gen := spawn(t, "gen", g)
	ctx := spawn(t, "ctx", c)
	gr, _ := gen.wait(t, 15*time.Second)
	cr, _ := ctx.wait(t, 15*time.Second) // well inside the 20 s transfer timeout
	if !strings.Contains(gr.FirstError, "handshake") || !strings.Contains(gr.FirstError, "ctx/0") {
		t.Fatalf("gen's failure does not name the handshake with ctx/0: %q", gr.FirstError)
	}
	if cr.Failed != 3 || !strings.Contains(cr.FirstError, "refused our key") || !strings.Contains(cr.FirstError, "gen/0") {
		t.Fatalf("ctx (the side with the wrong key) does not name gen/0's refusal of its key: %+v", cr)
	}
}

// TestPeerExitingOnAMistakeIsNamedAtOnce: ctx runs as another instance
// (ctx2) than gen expects. gen names the stranger's Hello when its wait
// for ctx's ends (its --timeout, 3 s here) and exits on it; ctx, which
// took gen's Hello and started its requests, must fail within seconds of
// gen's exit naming gen/0 and the error gen exited on (its goodbye's
// reason), not wait for a restart of gen until its own --timeout (2 min
// here) nor blame a gen that merely went down. (Checked to fail before
// the goodbye carried a reason: ctx's report named no reason, and its
// requests said only that gen went down.)
func TestPeerExitingOnAMistakeIsNamedAtOnce(t *testing.T) {
	g, c := options(t, 4, 0)
	g.Timeout, c.Timeout = 3*time.Second, 2*time.Minute
	c.Instance = "ctx2"
	gen := spawn(t, "gen", g)
	ctx := spawn(t, "ctx", c)
	gr, _ := gen.wait(t, time.Minute)
	gone := time.Now()
	cr, _ := ctx.wait(t, 30*time.Second) // far inside ctx's own 2 min --timeout
	t.Logf("ctx ended %v after gen: %+v", time.Since(gone).Round(time.Millisecond), cr)
	if gr.Failed != 4 || !strings.Contains(gr.FirstError, "ctx2/0") {
		t.Fatalf("gen does not fail naming ctx2/0's Hello: %+v", gr)
	}
	if !strings.HasPrefix(cr.PeerReason, "gen/0: ") || !strings.Contains(cr.PeerReason, "ctx2/0") {
		t.Fatalf("ctx does not name gen/0 and the error it exited on (a Hello from ctx2/0): peer_reason %q, report %+v", cr.PeerReason, cr)
	}
	if cr.Failed != 4 || cr.OK != 0 || cr.LeakedBlocks != 0 || !cr.PeerClosed {
		t.Fatalf("ctx report %+v", cr)
	}
	for _, e := range cr.Errors {
		if !strings.Contains(e, "exited on an error") {
			t.Errorf("ctx's request error %q does not say that gen exited on an error", e)
		}
	}
}
