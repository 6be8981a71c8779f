package discovery

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// TestClustersListsRanksOfEveryCluster: Clusters names the ranks live in
// each cluster of the etcd, so that a rank waiting for peers under one
// --cluster can tell its user that they registered under another (a
// typo, another case), which neither side learned before: each waited
// for its own cluster only and named the peer "not registered".
// A rank that left is not listed (its incarnation key stays).
func TestClustersListsRanksOfEveryCluster(t *testing.T) {
	mine, other := clusterName(t), clusterName(t)+"-other"
	for _, c := range []struct {
		cluster  string
		instance string
		rank     int32
	}{{mine, "ctx", 0}, {other, "gen", 1}, {other, "gen", 0}} {
		r := newEtcdRegistry(t, c.cluster)
		if err := r.Register(ctxFor(t, 10*time.Second), testRecord(c.instance, c.rank, 1)); err != nil {
			t.Fatal(err)
		}
	}
	gone := newEtcdRegistry(t, other)
	if err := gone.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := Clusters(ctxFor(t, 10*time.Second), "etcd://"+etcdEndpoints(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]messages.PeerID{mine: {{Instance: "ctx", Rank: 0}}, other: {{Instance: "gen", Rank: 0}, {Instance: "gen", Rank: 1}}}
	for c, ids := range want {
		if !slices.Equal(got[c], ids) {
			t.Errorf("cluster %s: %v, want %v (all: %v)", c, got[c], ids, got)
		}
	}
}

// TestClustersNamesAnEtcdThatIsNotThere: nothing listening is an error
// naming the endpoint, within the dial timeout.
func TestClustersNamesAnEtcdThatIsNotThere(t *testing.T) {
	_, err := Clusters(ctxFor(t, 10*time.Second), "etcd://127.0.0.1:1", WithDialTimeout(200*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("%v, want an error naming 127.0.0.1:1", err)
	}
	if _, err := Clusters(ctxFor(t, time.Second), "etcd://nohost"); err == nil {
		t.Fatal("etcd://nohost: no error")
	}
}

// TestClustersEndsWithItsContextWhenAuthenticating: with a user (WithAuth)
// the etcd client authenticates as it is made, and that wait took the
// client's own context (Background) and the dial timeout, not ctx: the
// CLI's cluster hint, stopped as its run ends, kept the run's exit
// waiting for an etcd that answers nothing, up to the dial timeout (here
// an hour). It must end with ctx.
func TestClustersEndsWithItsContextWhenAuthenticating(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, and never says a word
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Clusters(ctx, "etcd://"+ln.Addr().String(), WithAuth("u", "p"), WithDialTimeout(time.Hour))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("no error from an etcd that answers nothing")
		}
	case <-time.After(time.Minute):
		t.Fatal("Clusters with its context cancelled still waits a minute on")
	}
}
