package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/etcdlocal"
	"github.com/kvxfer/kvxfer/messages"
)

// TestCtxNamesThePeersOtherCluster: gen registered under --cluster prod,
// ctx started with --cluster Prod. Each waits for its own cluster only,
// and ctx failed with "gen/0 (not registered in etcd cluster Prod)" and
// no word that gen/0 was in etcd all along, under another name. ctx's
// error now says where the gen ranks are and what to do.
func TestCtxNamesThePeersOtherCluster(t *testing.T) {
	srv := etcdHolding(t, "prod", "gen")
	root := newRootCmdWith(newApp())
	var out, errOut lockedBuffer // the hint's warning is logged from its own goroutine
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"ctx", "--insecure", "--backend", "shm", "--pool", "512MiB", "--requests", "1",
		"--bind", "ipc://" + filepath.Join(t.TempDir(), "ctx.sock"),
		"--discovery", srv.URL(), "--cluster", "Prod", "--timeout", "3s"})
	err := root.Execute()
	want := `no gen rank is registered in etcd cluster "Prod" (--cluster), but gen/0 registered in cluster "prod": give every ctx and gen process the same --cluster`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%v, want an error containing %q", err, want)
	}
	if !strings.Contains(errOut.String(), `but gen/0 registered in cluster \"prod\"`) {
		t.Errorf("no warning with the hint in the log:\n%s", errOut.String())
	}
}

// TestGenNamesEtcdForAPeerThatNeverRegistered: gen started with a
// misspelt --peer (cxt) in a cluster where ctx/0 is registered. gen
// warned and failed with "cxt/0 (not registered in etcd cluster c1)" and
// nothing more: no word of which etcd, what to check, or that ctx/0 is
// there. Its error now says all three. (Its warning while it waits says
// the same; node's TestEtcdNeverRegisteredHintWhileThePeerIsWaitedFor
// checks it there, where no deadline races the warning's tick.)
func TestGenNamesEtcdForAPeerThatNeverRegistered(t *testing.T) {
	srv := etcdHolding(t, "c1", "ctx")
	root := newRootCmdWith(newApp())
	var out, errOut lockedBuffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"gen", "--insecure", "--backend", "shm", "--pool", "512MiB", "--requests", "1",
		"--bind", "ipc://" + filepath.Join(t.TempDir(), "gen.sock"), "--peer", "cxt",
		"--discovery", srv.URL(), "--cluster", "c1", "--timeout", "5s"})
	err := root.Execute()
	want := `cxt/0 (not registered in etcd cluster c1): no rank of instance cxt is registered there (etcd at ` + srv.URL() +
		`): is the cxt process running, started with cluster c1 and instance name "cxt"? Ranks of other instances registered in c1: ctx/0`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%v, want an error containing %q", err, want)
	}
}

// lockedBuffer is a bytes.Buffer written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPeerElsewhere: the hint only where the peer instance has no rank
// in this cluster and some in another; ranks of other instances elsewhere
// are no hint.
func TestPeerElsewhere(t *testing.T) {
	g0, g1, c0 := messages.PeerID{Instance: "gen", Rank: 0}, messages.PeerID{Instance: "gen", Rank: 1}, messages.PeerID{Instance: "ctx", Rank: 0}
	for _, c := range []struct {
		clusters map[string][]messages.PeerID
		hint     string
		found    bool
	}{
		{map[string][]messages.PeerID{"a": {c0, g0}, "b": {g1}}, "", true},
		{map[string][]messages.PeerID{"a": {c0}, "b": {c0}}, "", false},
		{map[string][]messages.PeerID{"a": {c0}, "b": {g0, g1}, "c": {g0}}, `but gen/0, gen/1 registered in cluster "b" and gen/0 registered in cluster "c"`, false},
		{map[string][]messages.PeerID{}, "", false},
	} {
		h, found := peerElsewhere(c.clusters, "a", "gen")
		if found != c.found || (c.hint == "") != (h == "") || !strings.Contains(h, c.hint) {
			t.Errorf("%v: %q, %v; want %q, %v", c.clusters, h, found, c.hint, c.found)
		}
	}
}

// registeringCtx runs `kvxfer ctx` registering as ctx/0 of cluster c1 in
// the etcd at url, with --timeout timeout, and returns its error; it
// fails the test with stillRuns when the command still runs as give
// fires.
func registeringCtx[T any](t *testing.T, url, timeout string, give <-chan T, stillRuns string) error {
	t.Helper()
	root := newRootCmdWith(newApp())
	var out, errOut lockedBuffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"ctx", "--insecure", "--backend", "shm", "--pool", "512MiB", "--requests", "1",
		"--bind", "ipc://" + filepath.Join(t.TempDir(), "ctx.sock"),
		"--discovery", url, "--cluster", "c1", "--timeout", timeout})
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()
	select {
	case err := <-done:
		return err
	case <-give:
		t.Fatal(stillRuns)
		return nil
	}
}

// TestSecondProcessAsOneRankEndsAtItsTimeout: a rank's key held by a live
// process (another ctx started as the same rank, a forgotten --tp-rank):
// the second process waited for the holder's lease to go without bound,
// past its --timeout. It now fails at --timeout, saying so and what to do.
func TestSecondProcessAsOneRankEndsAtItsTimeout(t *testing.T) {
	srv := etcdHolding(t, "c1", "ctx") // the live holder of ctx/0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := registeringCtx(t, srv.URL(), "2s", ctx.Done(), "a second process as ctx/0 still waits a minute into its --timeout 2s")
	for _, want := range []string{"--timeout 2s", "still held", "give this one its own --tp-rank or --instance"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v, want an error containing %q", err, want)
		}
	}
}

// TestUnreachableEtcdIsNotBlamedOnAHeldRank: an etcd that nothing answers
// at fails registration, and the error names what the dial met ("is etcd
// running there?"), never another process holding the rank (no key is
// held; the held-rank words were once added to any deadline, whoever's).
// With --timeout 10m the dial's own deadline (5 s) ends it, well inside
// --timeout, so the error must not say --timeout passed either; with
// --timeout 2s, under the dial's, --timeout's deadline ends the dial and
// may be named.
func TestUnreachableEtcdIsNotBlamedOnAHeldRank(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there now
	for _, c := range []struct {
		timeout string
		wrong   []string
	}{
		{"10m", []string{"within --timeout", "another process runs as this rank"}},
		{"2s", []string{"another process runs as this rank"}},
	} {
		err := registeringCtx(t, "etcd://"+addr, c.timeout, time.After(5*time.Minute),
			"ctx with an unreachable etcd and --timeout "+c.timeout+" still runs 5 minutes on")
		if err == nil || !strings.Contains(err.Error(), "is etcd running there?") {
			t.Fatalf("--timeout %s: %v, want discovery's words for an etcd nothing answers at", c.timeout, err)
		}
		for _, wrong := range c.wrong {
			if strings.Contains(err.Error(), wrong) {
				t.Fatalf("--timeout %s: %v: says %q, but no process holds the rank", c.timeout, err, wrong)
			}
		}
	}
}

// etcdHolding starts an etcd in which rank 0 of instance registered in
// cluster, its lease kept alive until the test ends.
func etcdHolding(t *testing.T, cluster, instance string) *etcdlocal.Server {
	t.Helper()
	srv, err := etcdlocal.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := discovery.NewEtcd(ctx, []string{srv.Endpoint()}, cluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	rec := discovery.Record{Instance: instance, Rank: 0, Incarnation: 1, ControlEndpoint: "tcp://127.0.0.1:1",
		Backend: "shm", AgentAddr: []byte("agent"), LayoutHash: 1, Parallel: messages.Parallel{TP: 1, PP: 1}}
	if err := reg.Register(ctx, rec); err != nil {
		t.Fatal(err)
	}
	return srv
}
