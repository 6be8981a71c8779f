package node_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestSilentServiceAtPeerEndpointNamed: the peer's endpoint is some
// other TCP service that accepts the connection and never says a word;
// WaitPeers' error names that (connected, but no ZeroMQ handshake) and
// does not ask about CURVE keys. (Checked to fail: before, the error only
// asked "is it running, and do both sides use the same CURVE keys (or both
// insecure)?".)
func TestSilentServiceAtPeerEndpointNamed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		held []net.Conn
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		_ = ln.Close()
		wg.Wait()
		for _, c := range held {
			_ = c.Close()
		}
	}()
	_, gc := pair(t, shm.Backend)
	gc.Peers[0].Endpoint = "tcp://" + ln.Addr().String()
	genN := open(t, gc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*beat)
	defer cancel()
	err = genN.WaitPeers(ctx)
	want := "ctx/0 at " + gc.Peers[0].Endpoint + ": connected to " + gc.Peers[0].Endpoint + ", but nothing there completed a ZeroMQ handshake"
	if !errors.Is(err, node.ErrPeerSilent) || !strings.Contains(err.Error(), want) {
		t.Fatalf("WaitPeers = %v, want ErrPeerSilent with %q", err, want)
	}
	if strings.Contains(err.Error(), "same CURVE keys") {
		t.Fatalf("WaitPeers = %v: asks about keys where the cause is known", err)
	}
}
